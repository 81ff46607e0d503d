"""Calibration recipes: YAML files, `key=value` overrides, validation, the resolved config.

A recipe is a readable YAML file whose header comment shows the command that runs it
(`recipes/calibrate_*.yaml`). Every key has a default here; an unknown key is an error that
lists the keys of its section. Overrides use dotted keys and YAML values:
`train.steps=200 data.context=[512,1024] deepspeed.zero_stage=3`.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from duocal.overrides import apply_overrides

RECIPES_DIR = Path(__file__).resolve().parents[2] / "recipes"
DEFAULT_RECIPE = "calibrate_demo"


@dataclass
class ModelSection:
    name_or_path: str = "demo"  # "demo" = the bundled demo model (duocal.demo.DEMO_MODEL_DIR)
    revision: str | None = None
    dtype: str = "float32"  # float32 | bfloat16 | float16: the frozen weights' dtype (gates train in fp32)


@dataclass
class DataSection:
    format: str = "demo"  # duocal.data.formats preset: demo | digits | nato
    haystack: Any = "synthetic"  # synthetic | a .txt / .jsonl file | {dataset: ..., split: ..., data_files: ...}
    text_field: str = "text"
    context: Any = (256, 1024)  # tokens per sample: an int or [min, max]
    num_passkeys: Any = (1, 6)
    depth: Any = (0.0, 1.0)
    questions: str = "all"  # "all": every needle is asked for (upstream), "one": one of them
    seed: int = 2024  # calibration samples are drawn with this seed (eval uses others: held out)


@dataclass
class AttentionSection:
    sink: int = 16  # streaming heads' first tokens during calibration (upstream: 128)
    recent: int = 64  # and their recent window (upstream: 256)
    block: int = 64  # query block of the blocked streaming attention (speed only)


@dataclass
class TrainSection:
    steps: int = 400
    batch_size: int = 1  # samples per optimisation step, all processes together
    micro_batch_size: int = 1  # samples per forward on one process
    lr: float = 0.02
    reg: float = 0.05  # weight of mean(|gate|) in the loss
    init: float = 1.0  # initial gate value
    warmup: float = 0.2  # fraction of steps of linear warm-up
    decay: float = 0.2  # fraction of steps of linear decay at the end
    min_lr_ratio: float = 0.1
    betas: Any = (0.9, 0.999)
    seed: int = 0
    threads: int | None = 1  # torch intra-op threads per process (None: leave torch's default)
    activation_checkpointing: bool = False  # recompute decoder layers in backward (long contexts)


@dataclass
class DeepSpeedSection:
    config: str | None = None  # a DeepSpeed JSON config (relative to the recipe); batch sizes are set from train.*
    zero_stage: int = 0  # 0 (plain data parallel), 1, 2 or 3; overrides the config's stage
    sequence_parallel: int = 1  # DeepSpeed Ulysses degree: 1 = off, else = the number of processes


@dataclass
class CheckpointSection:
    every: int = 50  # steps between checkpoints (0: never)
    keep: int = 1


@dataclass
class RankingSection:
    method: str = "measured"  # "gates" (upstream) | "measured" (ties resolved by measured loss; duocal.calibrate.ranking)
    tie: float = 0.01  # gates within this of each other (or of 1) count as tied
    samples: int = 8  # held-out samples on which candidate plans are measured
    seed: int = 2025
    max_candidates: int = 8


@dataclass
class DeploySection:
    sparsity: float = 0.5
    sink: int | None = 16  # streaming heads' sizes written into the profile (None: the calibration sizes)
    recent: int | None = 64


@dataclass
class Recipe:
    model: ModelSection = field(default_factory=ModelSection)
    data: DataSection = field(default_factory=DataSection)
    attention: AttentionSection = field(default_factory=AttentionSection)
    train: TrainSection = field(default_factory=TrainSection)
    deepspeed: DeepSpeedSection = field(default_factory=DeepSpeedSection)
    checkpoint: CheckpointSection = field(default_factory=CheckpointSection)
    ranking: RankingSection = field(default_factory=RankingSection)
    deploy: DeploySection = field(default_factory=DeploySection)
    source: str | None = None  # the file it came from (set by load_recipe)

    def to_dict(self) -> dict[str, Any]:
        return json.loads(json.dumps(dataclasses.asdict(self)))  # tuples -> lists

    def __post_init__(self):
        check_values(self)


def _unknown_keys(cls, data: Any, where: str) -> None:
    if not isinstance(data, dict):
        raise ValueError(f"recipe section {where or '(top level)'} must be a mapping, got {data!r}")
    names = [f.name for f in dataclasses.fields(cls)]
    unknown = sorted(set(data) - set(names))
    if unknown:
        prefix = f"{where}." if where else ""
        raise ValueError(
            f"unknown recipe key {', '.join(prefix + k for k in unknown)}; "
            f"{('section ' + where) if where else 'the top level'} has: {', '.join(names)}"
        )


_SECTIONS = {f.name: f.default_factory for f in dataclasses.fields(Recipe) if f.default_factory is not dataclasses.MISSING}


def recipe_from_dict(data: dict[str, Any]) -> Recipe:
    """Build and check a `Recipe`; unknown keys and bad values raise `ValueError`."""
    _unknown_keys(Recipe, data, "")
    sections = {}
    for name, cls in _SECTIONS.items():
        value = data.get(name) or {}
        _unknown_keys(cls, value, name)
        sections[name] = cls(**value)
    return Recipe(**sections, source=data.get("source"))


def resolve_recipe_path(name_or_path: str | Path | None) -> Path:
    """A path, or a shipped recipe's name (`calibrate_demo`, `calibrate_llama3_8b`, ...)."""
    if name_or_path is None:
        name_or_path = DEFAULT_RECIPE
    path = Path(name_or_path)
    if path.is_file():
        return path
    shipped = RECIPES_DIR / f"{path.name.removesuffix('.yaml')}.yaml"
    if shipped.is_file():
        return shipped
    names = sorted(p.stem for p in RECIPES_DIR.glob("calibrate_*.yaml"))
    raise ValueError(f"recipe {str(name_or_path)!r} is neither a file nor a shipped recipe; shipped: {', '.join(names)}")


def load_recipe(name_or_path: str | Path | None = None, overrides: list[str] = ()) -> Recipe:
    """Read a recipe (default: the demo one), apply `key=value` overrides, validate the values.

    Without a recipe and without the source tree's recipes/ folder (an installed wheel), the
    defaults of this module are used: they are the demo recipe's values.
    """
    if name_or_path is None and not (RECIPES_DIR / f"{DEFAULT_RECIPE}.yaml").is_file():
        recipe = recipe_from_dict(apply_overrides({}, list(overrides)))
        recipe.source = f"duocal.calibrate.recipe defaults ({DEFAULT_RECIPE})"
        return recipe
    path = resolve_recipe_path(name_or_path)
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except yaml.YAMLError as err:
        raise ValueError(f"{path} is not valid YAML: {err}") from None
    data.pop("source", None)
    recipe = recipe_from_dict(apply_overrides(data, list(overrides)))
    recipe.source = str(path)
    if recipe.deepspeed.config is not None and not Path(recipe.deepspeed.config).is_absolute():
        recipe.deepspeed.config = str((path.parent / recipe.deepspeed.config).resolve())
    return recipe


def save_resolved(recipe: Recipe, path: str | Path, extra: dict[str, Any] | None = None) -> Path:
    """The resolved recipe as YAML (what was actually run), next to the outputs."""
    from duocal_runtime.atomic import write_atomic

    data = recipe.to_dict()
    if extra:
        data["run"] = extra
    header = "# Resolved calibration config (recipe + overrides); rerun with: duocal calibrate THIS_FILE --output DIR\n"
    return write_atomic(path, header + yaml.safe_dump(data, sort_keys=False))


def load_resolved(path: str | Path) -> Recipe:
    data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    data.pop("run", None)
    source = data.pop("source", None)
    recipe = recipe_from_dict(data)
    recipe.source = source
    return recipe


def _pair(name: str, value: Any, kind=int) -> tuple:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return kind(value), kind(value)
    if isinstance(value, (list, tuple)) and len(value) == 2 and all(isinstance(v, (int, float)) for v in value):
        return kind(value[0]), kind(value[1])
    raise ValueError(f"{name} must be a number or [min, max], got {value!r}")


def check_values(r: Recipe) -> None:
    """Value checks that need no model (the model-dependent ones are in `run.validate`)."""
    lo, hi = _pair("data.context", r.data.context)
    if not 1 <= lo <= hi:
        raise ValueError(f"data.context must be positive with min <= max, got {r.data.context!r}")
    p_lo, p_hi = _pair("data.num_passkeys", r.data.num_passkeys)
    if not 1 <= p_lo <= p_hi:
        raise ValueError(f"data.num_passkeys must be >= 1 with min <= max, got {r.data.num_passkeys!r}")
    d_lo, d_hi = _pair("data.depth", r.data.depth, float)
    if not 0.0 <= d_lo <= d_hi <= 1.0:
        raise ValueError(f"data.depth must be a range within [0, 1], got {r.data.depth!r}")
    a = r.attention
    if a.sink < 0 or a.recent < 1 or a.block < 1:
        raise ValueError(f"attention needs sink >= 0, recent >= 1, block >= 1; got {a.sink}, {a.recent}, {a.block}")
    t = r.train
    positive = {"train.steps": t.steps, "train.batch_size": t.batch_size, "train.micro_batch_size": t.micro_batch_size}
    for name, value in positive.items():
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    if t.batch_size % t.micro_batch_size:
        raise ValueError(f"train.batch_size ({t.batch_size}) must be a multiple of train.micro_batch_size ({t.micro_batch_size})")
    if not (t.lr > 0 and t.reg >= 0 and 0 <= t.init <= 1):
        raise ValueError(f"need train.lr > 0, train.reg >= 0, train.init in [0, 1]; got {t.lr}, {t.reg}, {t.init}")
    if not (0 <= t.warmup <= 1 and 0 <= t.decay <= 1 and 0 < t.min_lr_ratio <= 1):
        raise ValueError("train.warmup and train.decay are fractions in [0, 1]; train.min_lr_ratio in (0, 1]")
    if r.deepspeed.zero_stage not in (0, 1, 2, 3):
        raise ValueError(f"deepspeed.zero_stage must be 0, 1, 2 or 3, got {r.deepspeed.zero_stage!r}")
    if r.deepspeed.sequence_parallel < 1:
        raise ValueError("deepspeed.sequence_parallel must be >= 1")
    if r.checkpoint.every < 0 or r.checkpoint.keep < 1:
        raise ValueError("checkpoint.every must be >= 0 and checkpoint.keep >= 1")
    if r.ranking.method not in ("gates", "measured"):
        raise ValueError(f"ranking.method must be 'gates' or 'measured', got {r.ranking.method!r}")
    if r.model.dtype not in ("float32", "bfloat16", "float16"):
        raise ValueError(f"model.dtype must be float32, bfloat16 or float16, got {r.model.dtype!r}")
    if not 0.0 <= r.deploy.sparsity <= 1.0:
        raise ValueError(f"deploy.sparsity must be in [0, 1], got {r.deploy.sparsity}")
