"""Per-head KV cache policies: what one KV head keeps. One module per policy, found by name.

| policy        | keeps                                                          | paper            |
|---------------|----------------------------------------------------------------|------------------|
| `full`        | every token                                                    | —                |
| `sink_window` | the first `sink` tokens and the last `recent`                  | StreamingLLM, arXiv 2309.17453 |
| `h2o`         | the last `recent`, and the `heavy` earlier ones with most attention | H2O, arXiv 2306.14048 |
| `sink_h2o`    | the first `sink` always, plus the `h2o` choice among the rest   | —                |
| `snapkv`      | the last `window`, and the `selected` its queries attend to most | SnapKV, arXiv 2404.14469 |

A policy module holds the policy's sizes and defaults (a frozen dataclass), its storage and
attention for prefill, dynamic decode and static (compileable) decode, its analytic size
(`tokens_kept`) and the state a benchmark gives it (`HeadGroup.fill`). Adding a policy is one new
module with a `@register_policy` class; see docs/contributing/extending.md.
"""

from .base import (
    POLICIES,
    HeadGroup,
    HeadPolicy,
    bounded_policy_names,
    make_policy,
    policy_class,
    policy_from_dict,
    register_policy,
)
from .full import Full
from .h2o import H2O
from .sink_h2o import SinkH2O
from .sink_window import SinkWindow
from .snapkv import SnapKV

__all__ = [
    "H2O",
    "POLICIES",
    "Full",
    "HeadGroup",
    "HeadPolicy",
    "SinkH2O",
    "SinkWindow",
    "SnapKV",
    "bounded_policy_names",
    "make_policy",
    "policy_class",
    "policy_from_dict",
    "register_policy",
]
