"""The calibration's model side, in one place: where a recipe's model is, the checks that need its
config and tokenizer (not its weights), the frozen model, and the gated objective built on it.
The training run (run.py), the measured ranking (ranking.py) and the step benchmark
(benchmarks/calibrate_step.py) all build from here.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

import duocal_runtime as dr
from duocal.calibrate.batches import StepData, make_generator
from duocal.calibrate.gated_attention import Gating, install, uninstall
from duocal.calibrate.gates import Gates
from duocal.calibrate.objective import GateObjective
from duocal.calibrate.recipe import Recipe
from duocal.data.padding import pad_token_id
from duocal.models import ModelRef
from duocal_runtime.compat import check_model_supported

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def model_ref(recipe: Recipe) -> ModelRef:
    """The recipe's model: `demo` (the bundled demo model), a known name (fetched into the cache
    once), a local folder, a .gguf file or a Hub id (see duocal.models)."""
    name = recipe.model.name_or_path
    return ModelRef.resolve(None if name == "demo" else name)


def model_path(recipe: Recipe) -> str:
    return model_ref(recipe).path


def model_name(recipe: Recipe) -> str:
    """The name a profile records: never a machine-specific path for the shipped demo model."""
    return model_ref(recipe).name


def load_config_and_tokenizer(recipe: Recipe):
    path = model_path(recipe)
    try:
        config = AutoConfig.from_pretrained(path, revision=recipe.model.revision)
        tokenizer = AutoTokenizer.from_pretrained(path, revision=recipe.model.revision)
    except OSError as err:
        raise ValueError(f"cannot load model {recipe.model.name_or_path!r} ({path}): {err}") from None
    return config, tokenizer


@dataclass
class Checked:
    config: Any
    tokenizer: Any
    generator: Any

    @property
    def pad_id(self) -> int:
        return pad_token_id(self.tokenizer, self.config)


def check_recipe(recipe: Recipe, nproc: int = 1) -> Checked:
    """Every check that needs the model's config and tokenizer but not its weights (cheap)."""
    config, tokenizer = load_config_and_tokenizer(recipe)
    check_model_supported(config)
    shape = dr.shape_of_config(config)
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    limit = getattr(text, "max_position_embeddings", None)
    longest = recipe.data.context if isinstance(recipe.data.context, int) else max(recipe.data.context)
    if limit is not None and longest > limit:
        raise ValueError(
            f"data.context goes up to {longest} tokens but {recipe.model.name_or_path} allows "
            f"{limit} (max_position_embeddings); lower data.context"
        )
    sp = recipe.deepspeed.sequence_parallel
    if sp > 1:
        if sp != nproc:
            raise ValueError(f"deepspeed.sequence_parallel={sp} must equal the number of processes (--nproc {nproc})")
        if shape.num_key_value_heads % sp:
            raise ValueError(
                f"deepspeed.sequence_parallel={sp} must divide the model's {shape.num_key_value_heads} KV heads"
            )
    StepData(None, 0, recipe.train.batch_size, recipe.train.micro_batch_size, nproc, sp > 1)  # batch arithmetic
    generator = make_generator(recipe.data, tokenizer)  # raises if the passkeys do not fit the context
    return Checked(config, tokenizer, generator)


def load_frozen_model(recipe: Recipe):
    """The recipe's model in its dtype, in eval mode (calibration never trains its weights)."""
    model = AutoModelForCausalLM.from_pretrained(
        model_path(recipe), revision=recipe.model.revision, dtype=DTYPES[recipe.model.dtype]
    )
    return model.eval()


def build_objective(model, recipe: Recipe, init: float | None = None, sequence_parallel=None) -> GateObjective:
    """Gates (one per layer and KV head, starting at `init`, default the recipe's) and the
    distillation objective on `model`'s decoder. Call inside `calibration_attention(model)`."""
    shape = dr.shape_of_config(model.config)
    a, t = recipe.attention, recipe.train
    gates = Gates(shape.num_hidden_layers, shape.num_key_value_heads, t.init if init is None else init)
    gating = Gating(a.sink, a.recent, a.block, sequence_parallel=sequence_parallel)
    return GateObjective(model.get_decoder(), gates, gating, t.reg, t.activation_checkpointing)


@contextlib.contextmanager
def calibration_attention(model):
    """The model runs the calibration attention inside the block, its own attention afterwards."""
    previous = install(model)
    try:
        yield model
    finally:
        uninstall(model, previous)
