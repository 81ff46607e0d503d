"""`sink_h2o`: the first `sink` tokens always, plus the `h2o` choice (heavy hitters + recent) among the rest.

StreamingLLM's attention sinks combined with H2O's heavy hitters; storage and attention are the
h2o policy's (see h2o.py), with the first `sink` ranks never evicted.
"""

from __future__ import annotations

from dataclasses import dataclass

from .base import HeadPolicy, register_policy
from .h2o import H2O, H2OGroup, StaticH2OGroup


@register_policy
@dataclass(frozen=True)
class SinkH2O(HeadPolicy):
    name = "sink_h2o"
    deploy_names = H2O.deploy_names
    sink: int = 4
    heavy: int = 124
    recent: int = 128

    def make_group(self, kv_heads, rep, max_length=None):
        return H2OGroup(self, kv_heads, rep) if max_length is None else StaticH2OGroup(self, kv_heads, rep)
