"""What a per-head policy is, the registry that finds policies by name, and the head-group base.

A policy is a frozen dataclass of sizes (tokens of the real, unpadded sequence) that says what
one KV head keeps, and builds the `HeadGroup` that stores and attends for the KV heads of a
layer sharing it. Policies are values: hashable, serialisable with `to_dict` /
`policy_from_dict`. Each policy lives in its own module of this package and registers itself
with `@register_policy`; nothing else in the runtime branches on policy names.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import Field, asdict, dataclass, field, fields
from typing import Any, ClassVar

import torch

from ..attention.ranks import ranks_of_new_tokens
from ..attention.rotation import Rotation
from ..errors import PlanError
from ..quant.codes import plain_bytes

POLICIES: dict[str, type[HeadPolicy]] = {}


def register_policy(cls: type[HeadPolicy]) -> type[HeadPolicy]:
    """Class decorator: make a policy known by its `name` (plans, profiles, `make_policy`)."""
    POLICIES[cls.name] = cls
    return cls


def option(default: str) -> Field:
    """A policy field that is a choice, not a size (e.g. `SinkWindow.positions`): not counted in `capacity`,
    checked by the policy itself, and stored by `sizes()` only where it differs from its default."""
    return field(default=default, metadata={"option": True})


def size_fields(policy) -> list[Field]:
    """A policy's (or policy class's) fields that are token counts."""
    return [f for f in fields(policy) if not f.metadata.get("option")]


def bounded_policy_names() -> tuple[str, ...]:
    """Policies that keep a bounded number of tokens per head: the choices for the bounded heads of a plan."""
    return tuple(name for name, cls in POLICIES.items() if cls.bounded)


def policy_class(name: Any) -> type[HeadPolicy]:
    if name not in POLICIES:
        raise PlanError(f"unknown policy {name!r}; choose one of {', '.join(POLICIES)}")
    return POLICIES[name]


def make_policy(name: str, **sizes: int | None) -> HeadPolicy:
    """Build a policy by its user-facing name, ignoring sizes it does not use."""
    cls = policy_class(name)
    wanted = {f.name for f in fields(cls)}
    return cls(**{k: v for k, v in sizes.items() if k in wanted and v is not None})


def policy_from_dict(data: dict) -> HeadPolicy:
    data = dict(data)
    cls = policy_class(data.pop("policy", None))
    unknown = set(data) - {f.name for f in fields(cls)}
    if unknown:
        raise PlanError(f"{cls.name}: unknown size field(s) {sorted(unknown)}")
    return cls(**data)


@dataclass(frozen=True)
class HeadPolicy(ABC):
    """Base of every policy. Subclasses are frozen dataclasses whose fields are its sizes (token counts).

    A policy owns its rule: `keeps` says which slots a head holds, and the groups it builds
    (`make_group`), the static groups and the profiler all ask it. Its fields are its sizes (and its
    choices, declared with `option`) everywhere (plans, profiles' deploy defaults, measurements): a new
    policy or size field needs no edit elsewhere.
    """

    name: ClassVar[str]
    bounded: ClassVar[bool] = True  # keeps at most `capacity` tokens per head
    chunking_changes_result: ClassVar[bool] = False  # True when a prompt cut into chunks keeps other tokens

    def __post_init__(self):
        for f in size_fields(self):
            value = getattr(self, f.name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise PlanError(f"{self.name}: {f.name} must be a positive integer number of tokens, got {value!r}")

    @property
    def capacity(self) -> int | None:
        """Most tokens one head keeps (None: unbounded)."""
        return sum(getattr(self, f.name) for f in size_fields(self)) if self.bounded else None

    @property
    def label(self) -> str:
        """The policy's name, and its storage where a policy stores more than one way (`full-kv4`)."""
        return self.name

    def tokens_kept(self, seq_len: int) -> int:
        """Tokens one head holds after `seq_len` real tokens (the analytic size of its cache)."""
        return seq_len if self.capacity is None else min(seq_len, self.capacity)

    @property
    def full_attention_prefix(self) -> int:
        """First tokens of a sequence that a head of this policy attends to and keeps exactly as a full head
        does, its state nothing but their keys and values: a new cache can take them from full attention's
        (`DuoCache.load_prefix`). 0 where the state holds more (attention scores, codes)."""
        return 0

    def kv_bytes(self, seq_len: int, head_dim: int, dtype_bytes: int) -> int:
        """Bytes one KV head holds (keys and values) after `seq_len` real tokens."""
        return plain_bytes(self.tokens_kept(seq_len), head_dim, dtype_bytes)

    def check_head_dim(self, head_dim: int) -> None:  # noqa: B027 (an optional hook: most policies store any width)
        """Raise `PlanError` if the policy cannot store heads of `head_dim` channels (all can, by default)."""

    @property
    def cache_positions(self) -> bool:
        """Whether heads of this policy see positions within their cache (no distance beyond `capacity`)."""
        return False

    def sizes(self) -> dict[str, int]:
        """The policy's size fields by name, and its options that differ from their defaults (what profiles and
        plans store)."""
        return {
            name: value
            for name, value in asdict(self).items()
            if not self.__dataclass_fields__[name].metadata.get("option")
            or value != self.__dataclass_fields__[name].default
        }

    def to_dict(self) -> dict:
        return {"policy": self.name, **self.sizes()}

    @abstractmethod
    def keeps(self, k_rank: torch.Tensor, real_total: torch.Tensor, score: torch.Tensor | None = None) -> torch.Tensor:
        """The rule: which slots one head holds once `real_total` real tokens were seen.

        k_rank [..., S] (each slot's rank, -1 empty), real_total [...] (broadcast over S), score
        [..., S] the attention mass accumulated per slot (for policies that choose by it) -> [..., S] bool.
        """

    @abstractmethod
    def make_group(self, kv_heads: list[int], rep: int, max_length: int | None = None) -> HeadGroup:
        """Storage and attention for `kv_heads` of one layer (`rep` query heads each). With
        `max_length`, a static group: fixed buffers, compileable decode steps."""


class HeadGroup(ABC):
    """Storage and attention for the KV heads of one layer that share a policy.

    Owns key/value tensors of shape [B, G, S, D] (G = len(kv_heads)) and attends its query
    heads (R = `rep` per KV head, [B, G*R, T, D]) to them. Bounded groups record each slot's
    real-token rank in `rank` ([B, S] when every head of the group keeps the same slots, [B, G, S]
    when each head keeps its own; -1 for an empty slot). What a group must do, as transformers'
    `CacheLayerMixin` declares what a cache layer must do:

    - `attend(q, k, v, step)`: store the pass's new tokens, attend, evict (every pass of a dynamic
      cache, and prefill passes of a static one);
    - `decode(q, k, v, step)`: one token per row in a static group, with no host sync and no
      data-dependent shape (static groups only);
    - `fill(...)`: take the state a prompt leaves, with random keys and values (benchmarks);
    - `stored_tokens`, `nbytes`, `kept_ranks`, `select_batch`: inspection and beam reordering.
    """

    def __init__(self, policy: HeadPolicy, kv_heads: list[int], rep: int):
        self.policy, self.kv_heads, self.rep = policy, kv_heads, rep
        self.k: torch.Tensor | None = None
        self.v: torch.Tensor | None = None
        self.rank: torch.Tensor | None = None

    @property
    def num_kv(self) -> int:
        return len(self.kv_heads)

    def nbytes(self) -> int:
        """Bytes of the key and value tensors this group holds (allocated, slack included)."""
        return 0 if self.k is None else self.k.nbytes + self.v.nbytes

    def stored_tokens(self) -> int:
        """Slots held per row and head (allocated ones, for static groups)."""
        return 0 if self.k is None else self.k.shape[2]

    def state(self) -> dict[str, torch.Tensor]:
        """The tensors this group holds per batch row (dim 0): keys, values and whatever its policy keeps
        beside them (ranks, scores). A static group's state has fixed shapes: what paged storage holds."""
        return {
            name: value for name, value in vars(self).items() if isinstance(value, torch.Tensor) and value.ndim >= 2
        }

    def load_state(self, state: dict[str, torch.Tensor]) -> None:
        for name, value in state.items():
            setattr(self, name, value)

    def select_batch(self, index: torch.Tensor) -> None:
        """Keep the rows `index` (beam search, batch selection), in that order."""
        for name, value in self.state().items():
            setattr(self, name, value.index_select(0, index.to(value.device)))

    def kept_ranks(self, row: int, head: int) -> set[int]:
        """Real-token ranks that KV head `head` (index within the group) of batch row `row` holds."""
        if not self.policy.bounded:
            raise ValueError("full heads keep every token; kept ranks are tracked for bounded heads")
        if self.rank is None:
            return set()
        rank = self.rank[row, head] if self.rank.ndim == 3 else self.rank[row]
        return {int(r) for r in rank if r >= 0}

    @abstractmethod
    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, step: Step) -> torch.Tensor:
        """q [B, G*R, T, D], k/v [B, G, T, D] for the new tokens -> output [B, G*R, T, D]."""

    def store(self, k: torch.Tensor, v: torch.Tensor, step: Step) -> None:
        """Keep a first pass's keys and values (k/v [B, G, T, D]) as `attend` would, without attending: a
        prefix full attention computed, within the policy's `full_attention_prefix`."""
        raise NotImplementedError(
            f"{type(self).__name__} ({self.policy.label!r} heads) keeps more than keys and values: it cannot "
            "take a prefix from full attention's cache"
        )

    def shift_positions(self, delta: torch.Tensor, rotation: Rotation) -> None:
        """The stream's position base moved up by delta [B] (hf/stream_positions.py): only heads that see
        positions within their cache are in such a stream."""
        raise NotImplementedError(f"{self.policy.label!r} heads keep their original positions: they cannot move")

    def decode(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, step: DecodeStep) -> torch.Tensor:
        """One new token per row of a static cache: q [B, G*R, 1, D], k/v [B, G, 1, D] -> [B, G*R, 1, D]."""
        raise NotImplementedError(
            f"policy {self.policy.name!r} has no static group; use a dynamic cache "
            "(runtime.new_cache() without max_length)"
        )

    @abstractmethod
    def fill(self, batch: int, context: int, head_dim: int, dtype: torch.dtype, device: Any) -> None:
        """Take the state a `context`-token prompt leaves (random keys/values): for benchmarks."""


@dataclass(frozen=True)
class Step:
    """One forward pass through one layer: T new tokens for B rows.

    `pad_mask` [B, >= seen_before + T] is the caller's 2D attention mask over every token seen
    so far (None: nothing is padded). Full heads store padding like transformers' DynamicCache
    and mask it; bounded heads never store it.
    """

    seen_before: int
    new_valid: torch.Tensor  # [B, T] bool
    new_ranks: torch.Tensor  # [B, T] long, -1 for padding
    real_after: torch.Tensor  # [B] long: real tokens seen once this pass is stored
    pad_mask: torch.Tensor | None
    scaling: float
    position_base: torch.Tensor | None = None  # [B]: the model was given each token's rank less this
    rotation: Rotation | None = None  # the model's RoPE, for heads that see positions within their cache

    @property
    def all_valid(self) -> bool:
        return self.pad_mask is None or bool(self.new_valid.all())

    @classmethod
    def make(
        cls, seen_before: int, real_before: torch.Tensor, num_new: int, pad_mask, scaling: float, **positions
    ) -> Step:
        batch = real_before.shape[0]
        if pad_mask is None:
            valid = torch.ones(batch, num_new, dtype=torch.bool, device=real_before.device)
        else:
            valid = pad_mask[:, seen_before : seen_before + num_new]
        ranks = ranks_of_new_tokens(valid, real_before)
        return cls(seen_before, valid, ranks, real_before + valid.sum(1), pad_mask, scaling, **positions)


@dataclass(frozen=True)
class DecodeStep:
    """One new token per row in a static cache, described by tensors only (no host sync, no
    data-dependent shape): what a compiled decode step sees.

    `position` is the 0-d slot of the token in the padded sequence (tokens seen before it);
    `pad_mask` [B, max_length] is False for padding and for positions not yet written.
    """

    position: torch.Tensor  # [] long
    new_valid: torch.Tensor  # [B] bool
    new_rank: torch.Tensor  # [B] long, -1 for padding
    real_after: torch.Tensor  # [B] long
    pad_mask: torch.Tensor | None
    scaling: float
    position_base: torch.Tensor | None = None  # as in `Step`
    rotation: Rotation | None = None

    @classmethod
    def make(
        cls, position: torch.Tensor, real_before: torch.Tensor, pad_mask, scaling: float, **positions
    ) -> DecodeStep:
        if pad_mask is None:
            valid = torch.ones_like(real_before, dtype=torch.bool)
        else:
            valid = pad_mask.index_select(1, position.view(1))[:, 0]
        rank = torch.where(valid, real_before, -1)
        return cls(position, valid, rank, real_before + valid.long(), pad_mask, scaling, **positions)


# how dynamic full-head buffers grow: exact on the first pass, then by ~1.6% at a time
FULL_SLACK = 1 / 64
FULL_ALIGN = 8


def full_slots(needed: int, first: bool) -> int:
    """Slots a dynamic full group allocates to hold `needed` tokens (exact on the first pass)."""
    return needed if first else needed + max(FULL_ALIGN, math.ceil(needed * FULL_SLACK))
