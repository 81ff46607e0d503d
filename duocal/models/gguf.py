"""GGUF -> a plain transformers folder (config, fp32 safetensors, tokenizer).

transformers loads GGUF files (with the `gguf` package) and dequantizes them, but refuses to
save such a model; rebuilding the same architecture from its config without the quantization
config and loading the state dict gives a normal model that saves and reloads fast.
"""

from __future__ import annotations

from pathlib import Path


class GGUFError(ValueError):
    """A GGUF file that transformers cannot read as a causal LM."""


def convert_gguf(gguf_file: Path, out_dir: Path) -> None:
    """Write `out_dir` (must not exist yet or be empty) from `gguf_file`."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, name = str(gguf_file.parent), gguf_file.name
    try:
        loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    except (OSError, ValueError, KeyError, RuntimeError) as err:
        raise GGUFError(f"{gguf_file}: transformers cannot load it as a causal LM ({err})") from None
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = type(loaded)(config)
    model.load_state_dict(loaded.state_dict())
    write_model_folder(model, out_dir)
    tokenizer.save_pretrained(out_dir)


def write_model_folder(model, out_dir: Path) -> None:
    """config.json, generation_config.json and model.safetensors, as `save_pretrained` writes them for
    a plain model. Not `save_pretrained` itself: it unwraps the model through accelerate, which imports
    DeepSpeed (seconds, and a warning) whenever it is installed; a fetch has no use for it.
    Tied weights are stored once, under the input embedding's name, and tied again on load."""
    from safetensors.torch import save_file

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    model.config.architectures = [type(model).__name__]  # as save_pretrained sets it: vLLM picks its model class by it
    model.config.save_pretrained(out_dir)
    if model.generation_config is not None:
        model.generation_config.save_pretrained(out_dir)
    save_file(weights_once(model), str(out_dir / "model.safetensors"), metadata={"format": "pt"})


def weights_once(model) -> dict:
    """The state dict with each tied weight under its first name only (the input embedding, not `lm_head`), as
    save_pretrained stores it: vLLM skips `lm_head.weight` of a tied model, so it must not be the one kept."""
    seen, weights = set(), {}
    for name, tensor in model.state_dict().items():
        if tensor.data_ptr() not in seen:
            seen.add(tensor.data_ptr())
            weights[name] = tensor.contiguous()
    return weights
