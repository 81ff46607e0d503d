"""Per-head KV pages inside transformers' continuous batching (`model.generate_batch`,
`model.init_continuous_batching`, `transformers serve`): pages.py (where heads live in the pool),
paged_cache.py (the engine's cache, built from a plan), paged_attention.py (a packed pass, every
group), manager.py (the engine's manager with that cache). Everything here follows transformers
5.24's continuous-batching internals; nothing is imported until a runtime starts batching."""
