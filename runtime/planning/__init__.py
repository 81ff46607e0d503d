"""Plans: a policy per (layer, KV head) from a profile, by sparsity, threshold or budget."""
