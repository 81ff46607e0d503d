"""Calibration recipes: YAML files, `key=value` overrides, validation, the resolved config.

A recipe is a readable YAML file whose header comment shows the command that runs it
(`recipes/calibrate_*.yaml`). Every key has a default here; an unknown key is an error that
lists the keys of its section. Overrides use dotted keys and YAML values:
`train.steps=200 data.context=[512,1024] deepspeed.zero_stage=3`.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from duocal.calibrate.overrides import apply_overrides
from duocal_runtime.files.atomic import write_atomic
from duocal_runtime.files.regular_files import check_regular

RECIPES_DIR = Path(str(resources.files("duocal.recipes")))  # recipes/ in a checkout; package data when installed
DEFAULT_RECIPE = "calibrate_demo"


class Section(BaseModel):
    """Typed recipe values: wrong types, NaN/inf and out-of-range numbers are refused at load.
    Numbers given as YAML strings ("0.02") are read as numbers; "abc" is an error."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, validate_assignment=True)


PositiveInt = Annotated[int, Field(ge=1)]
Fraction = Annotated[float, Field(ge=0.0, le=1.0)]
IntRange = PositiveInt | Annotated[list[PositiveInt], Field(min_length=2, max_length=2)]
FractionRange = Fraction | Annotated[list[Fraction], Field(min_length=2, max_length=2)]


def _ordered(name: str, value: Any) -> None:
    if isinstance(value, list) and value[0] > value[1]:
        raise ValueError(f"{name} must be [min, max] with min <= max, got {value}")


class ModelSection(Section):
    name_or_path: str = "demo"  # "demo" = the bundled demo model; or a known name, a folder, a .gguf file, a Hub id
    revision: str | None = None
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"  # the frozen weights' dtype (gates train in fp32)


class DataSection(Section):
    format: str = "demo"  # duocal.data.passkey_formats preset: demo | digits | nato; or mixed (mixed_samples.py)
    haystack: str | dict[str, Any] = "synthetic"  # synthetic | repeated | a .txt/.jsonl file | {dataset: ...}
    # (mixed: repeated and/or text, e.g. "repeated,text")
    values: list[str] = ["number", "word", "uuid"]  # mixed: the keys' kinds
    framings: list[str] = ["chat", "plain"]  # mixed: the chat template and/or plain text
    text_field: str = "text"
    context: IntRange = [256, 1024]  # tokens per sample: an int or [min, max]
    num_passkeys: IntRange = [1, 6]  # mixed: 1
    depth: FractionRange = [0.0, 1.0]
    questions: Literal["all", "one"] = "all"  # "all": every needle is asked for (upstream), "one": one of them
    seed: int = 2024  # calibration samples are drawn with this seed (eval uses others: held out)

    @model_validator(mode="after")
    def _ranges(self):
        for name in ("context", "num_passkeys", "depth"):
            _ordered(f"data.{name}", getattr(self, name))
        defaults = {name: type(self).model_fields[name].default for name in ("values", "framings")}
        mixed_only = [name for name, default in defaults.items() if getattr(self, name) != default]
        if self.format != "mixed" and mixed_only:
            raise ValueError(f"data.{mixed_only[0]} chooses mixed samples: set data.format: mixed")
        if self.format == "mixed" and self.num_passkeys not in (1, [1, 1]):
            raise ValueError(
                f"mixed samples hide one key each (and ask for it), got data.num_passkeys={self.num_passkeys}: "
                "set data.num_passkeys=1"
            )
        return self


class AttentionSection(Section):
    sink: Annotated[int, Field(ge=0)] = 16  # streaming heads' first tokens during calibration (upstream: 128)
    recent: PositiveInt = 64  # and their recent tokens (upstream: 256)
    block: PositiveInt = 64  # query block of the blocked streaming attention (speed only)


class TrainSection(Section):
    steps: PositiveInt = 400
    batch_size: PositiveInt = 1  # samples per optimisation step, all processes together
    micro_batch_size: PositiveInt = 1  # samples per forward on one process
    lr: Annotated[float, Field(gt=0.0, le=10.0)] = 0.02
    reg: Annotated[float, Field(ge=0.0)] = 0.05  # weight of mean(|gate|) in the loss
    init: Fraction = 1.0  # initial gate value
    warmup: Fraction = 0.2  # fraction of steps of linear warm-up
    decay: Fraction = 0.2  # fraction of steps of linear decay at the end
    min_lr_ratio: Annotated[float, Field(gt=0.0, le=1.0)] = 0.1
    betas: Annotated[list[Annotated[float, Field(ge=0.0, lt=1.0)]], Field(min_length=2, max_length=2)] = [0.9, 0.999]
    seed: int = 0
    threads: PositiveInt | None = 1  # torch intra-op threads per process (None: leave torch's default)
    activation_checkpointing: bool = False  # recompute decoder layers in backward (long contexts)

    @model_validator(mode="after")
    def _batches(self):
        if self.batch_size % self.micro_batch_size:
            raise ValueError(
                f"train.batch_size ({self.batch_size}) must be a multiple of train.micro_batch_size "
                f"({self.micro_batch_size})"
            )
        return self


class DeepSpeedSection(Section):
    config: str | None = None  # a DeepSpeed JSON config (relative to the recipe); batch sizes are set from train.*
    zero_stage: Literal[0, 1, 2, 3] = 0  # 0 (plain data parallel), 1, 2 or 3; overrides the config's stage
    sequence_parallel: PositiveInt = 1  # DeepSpeed Ulysses degree: 1 = off, else = the number of processes


class CheckpointSection(Section):
    every: Annotated[int, Field(ge=0)] = 50  # steps between checkpoints (0: never)
    keep: PositiveInt = 1


class RankingSection(Section):
    method: Literal["gates", "measured"] = (
        "measured"  # "gates" (upstream) | "measured" (ties resolved by measured loss)
    )
    tie: Fraction = 0.01  # gates within this of each other (or of 1) count as tied
    samples: PositiveInt = 8  # held-out samples on which candidate plans are measured
    seed: int = 2025
    max_candidates: PositiveInt = 8
    nested: bool = False  # then order the heads sparsest plan first by the answer loss (calibrate/nested_ranking.py)
    nested_samples: PositiveInt = 12  # prompts of every kind of data.values / framings / haystack it is measured on
    nested_context: PositiveInt = 1536  # tokens per prompt at most


class DeploySection(Section):
    sparsity: Fraction = 0.5
    sink: PositiveInt | None = 16  # streaming heads' sizes written into the profile (None: the calibration sizes)
    recent: PositiveInt | None = 64


class Recipe(Section):
    model: ModelSection = Field(default_factory=ModelSection)
    data: DataSection = Field(default_factory=DataSection)
    attention: AttentionSection = Field(default_factory=AttentionSection)
    train: TrainSection = Field(default_factory=TrainSection)
    deepspeed: DeepSpeedSection = Field(default_factory=DeepSpeedSection)
    checkpoint: CheckpointSection = Field(default_factory=CheckpointSection)
    ranking: RankingSection = Field(default_factory=RankingSection)
    deploy: DeploySection = Field(default_factory=DeploySection)
    source: str | None = None  # the file it came from (set by load_recipe)

    def to_dict(self) -> dict[str, Any]:
        return self.model_dump(mode="json")


SECTIONS = {name: f.annotation for name, f in Recipe.model_fields.items() if name != "source"}


def _unknown_keys(cls, data: Any, where: str) -> None:
    if not isinstance(data, dict):
        raise ValueError(
            f"recipe section {where or '(top level)'} must be a mapping of keys to values, got "
            f"{type(data).__name__} {data!r:.60}"
        )
    names = list(cls.model_fields)
    unknown = sorted(set(map(str, data)) - set(names))
    if unknown:
        prefix = f"{where}." if where else ""
        raise ValueError(
            f"unknown recipe key {', '.join(prefix + k for k in unknown)}; "
            f"{('section ' + where) if where else 'the top level'} has: {', '.join(names)}"
        )


def describe_errors(err: ValidationError) -> str:
    """pydantic's errors as `key: what is wrong` lines."""
    lines = []
    for e in err.errors():
        if e["type"] == "value_error":  # our own checks: the message names the key
            lines.append(e["msg"].removeprefix("Value error, "))
            continue
        loc = ".".join(
            str(part)
            for part in e["loc"]
            if isinstance(part, str)
            and "[" not in part
            and part not in ("int", "float", "str", "constrained-int", "constrained-float")
        )
        lines.append(f"{loc}: {e['msg']} (got {e['input']!r:.60})")
    return "; ".join(dict.fromkeys(lines))


def recipe_from_dict(data: Any) -> Recipe:
    """Build and check a `Recipe`: unknown keys, wrong types, NaN/inf and bad ranges raise `ValueError`."""
    _unknown_keys(Recipe, data, "")
    for name, cls in SECTIONS.items():
        _unknown_keys(cls, data.get(name) or {}, name)
    try:
        return Recipe(**{k: v or {} if k in SECTIONS else v for k, v in data.items()})
    except ValidationError as err:
        raise ValueError(f"bad recipe value: {describe_errors(err)}") from None


def shipped_recipes() -> dict[str, Path]:
    """Recipe name -> file, for every recipe duocal ships (calibration recipes and the demo model's)."""
    return {p.stem: p for p in sorted(RECIPES_DIR.glob("*.yaml"))}


def copy_recipe(name: str, folder: str | Path, force: bool = False) -> list[Path]:
    """Copy shipped recipe `name` and its DeepSpeed config (same relative place) into `folder`.
    Refuses to replace existing files unless `force`. Returns the files written, recipe first."""
    recipes = shipped_recipes()
    if name.removesuffix(".yaml") not in recipes:
        raise ValueError(f"no shipped recipe {name!r}; shipped: {', '.join(recipes)}")
    source = recipes[name.removesuffix(".yaml")]
    data = read_yaml(source, "recipe") or {}
    config = (data.get("deepspeed") or {}).get("config")
    files = [(source, Path(folder) / source.name)]
    if config and not Path(config).is_absolute():
        files.append((source.parent / config, Path(folder) / config))
    existing = [str(target) for _, target in files if target.exists() or target.is_symlink()]
    if existing and not force:
        raise ValueError(f"{existing[0]} already exists; pass --force to replace it")
    return [write_atomic(target, src.read_bytes()) for src, target in files]


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
    names = [name for name in shipped_recipes() if name.startswith("calibrate_")]
    raise ValueError(
        f"recipe {str(name_or_path)!r} is neither a file nor a shipped recipe; shipped: {', '.join(names)}"
    )


def read_yaml(path: Path, what: str) -> Any:
    """A YAML file's content, or `ValueError` naming the file and what is wrong with it."""
    check_regular(path, what)
    try:
        return yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as err:
        raise ValueError(f"{path} is not valid YAML: {err}") from None
    except (OSError, UnicodeDecodeError) as err:
        raise ValueError(f"cannot read the {what} {path}: {err}") from None


def load_recipe(name_or_path: str | Path | None = None, overrides: list[str] = ()) -> Recipe:
    """Read a recipe (default: the demo one), apply `key=value` overrides, validate the values."""
    path = resolve_recipe_path(name_or_path)
    data = read_yaml(path, "recipe")
    data = {} if data is None else data
    if not isinstance(data, dict):
        raise ValueError(
            f"{path}: a recipe is a mapping of sections (model:, data:, train: ...), not a {type(data).__name__}"
        )
    data.pop("source", None)
    try:
        recipe = recipe_from_dict(apply_overrides(data, list(overrides)))
    except ValueError as err:
        raise ValueError(f"{path}: {err}") from None
    recipe.source = str(path)
    if recipe.deepspeed.config is not None and not Path(recipe.deepspeed.config).is_absolute():
        recipe.deepspeed.config = str((path.parent / recipe.deepspeed.config).resolve())
    return recipe


def save_resolved(recipe: Recipe, path: str | Path, extra: dict[str, Any] | None = None) -> Path:
    """The resolved recipe as YAML (what was actually run), next to the outputs."""
    data = recipe.to_dict()
    if extra:
        data["run"] = extra
    header = "# Resolved calibration config (recipe + overrides); rerun with: duocal calibrate THIS_FILE --output DIR\n"
    return write_atomic(path, header + yaml.safe_dump(data, sort_keys=False))


def load_resolved(path: str | Path) -> Recipe:
    """The config.yaml a run saved (for --resume and the workers)."""
    path = Path(path)
    data = read_yaml(path, "resolved config")
    if not isinstance(data, dict):
        raise ValueError(
            f"{path} is not a resolved calibration config (a mapping); the run folder is damaged: "
            "start a new run with --output"
        )
    data.pop("run", None)
    source = data.pop("source", None)
    try:
        recipe = recipe_from_dict(data)
    except ValueError as err:
        raise ValueError(f"{path}: {err}") from None
    recipe.source = source
    return recipe
