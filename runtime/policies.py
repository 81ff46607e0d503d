"""Per-head KV cache policies: what one KV head keeps.

| policy        | keeps                                                        | paper |
|---------------|--------------------------------------------------------------|-------|
| `full`        | every token                                                  | —     |
| `sink_window` | the first `sink` tokens and the last `recent`                | StreamingLLM, arXiv 2309.17453 |
| `h2o`         | the last `recent` and the `heavy` earlier tokens with the largest accumulated attention | H2O, arXiv 2306.14048 |
| `sink_h2o`    | `sink` first tokens always, plus the `h2o` choice among the rest | —     |

Sizes count tokens of the real (unpadded) sequence. Policies are values: frozen, hashable, and
serialisable with `to_dict` / `policy_from_dict`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import ClassVar

from .errors import PlanError


def _check_sizes(policy) -> None:
    for f in fields(policy):
        value = getattr(policy, f.name)
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise PlanError(
                f"{policy.name}: {f.name} must be a positive integer number of tokens, got {value!r}"
            )


@dataclass(frozen=True)
class Full:
    name: ClassVar[str] = "full"

    @property
    def budget(self) -> int | None:
        return None

    def tokens_kept(self, seq_len: int) -> int:
        return seq_len

    def to_dict(self) -> dict:
        return {"policy": self.name}


@dataclass(frozen=True)
class _Bounded:
    """A policy that keeps at most `budget` tokens per head."""

    def __post_init__(self):
        _check_sizes(self)

    @property
    def budget(self) -> int:
        return sum(getattr(self, f.name) for f in fields(self))

    def tokens_kept(self, seq_len: int) -> int:
        return min(seq_len, self.budget)

    def to_dict(self) -> dict:
        return {"policy": self.name, **asdict(self)}


@dataclass(frozen=True)
class SinkWindow(_Bounded):
    name: ClassVar[str] = "sink_window"
    sink: int = 64
    recent: int = 256


@dataclass(frozen=True)
class H2O(_Bounded):
    name: ClassVar[str] = "h2o"
    heavy: int = 128
    recent: int = 128


@dataclass(frozen=True)
class SinkH2O(_Bounded):
    name: ClassVar[str] = "sink_h2o"
    sink: int = 4
    heavy: int = 124
    recent: int = 128


HeadPolicy = Full | SinkWindow | H2O | SinkH2O

POLICIES: dict[str, type] = {cls.name: cls for cls in (Full, SinkWindow, H2O, SinkH2O)}
STREAMING_POLICIES = ("sink_window", "h2o", "sink_h2o")


def make_policy(name: str, **sizes: int) -> HeadPolicy:
    """Build a policy by its user-facing name, ignoring sizes it does not use."""
    try:
        cls = POLICIES[name]
    except KeyError:
        raise PlanError(f"unknown policy {name!r}; choose one of {', '.join(POLICIES)}") from None
    wanted = {f.name for f in fields(cls)}
    return cls(**{k: v for k, v in sizes.items() if k in wanted and v is not None})


def policy_from_dict(data: dict) -> HeadPolicy:
    data = dict(data)
    name = data.pop("policy", None)
    if name not in POLICIES:
        raise PlanError(f"unknown policy {name!r}; choose one of {', '.join(POLICIES)}")
    cls = POLICIES[name]
    unknown = set(data) - {f.name for f in fields(cls)}
    if unknown:
        raise PlanError(f"{name}: unknown size field(s) {sorted(unknown)}")
    return cls(**data)
