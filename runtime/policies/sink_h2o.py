"""`sink_h2o`: the first `sink` tokens always, plus the `h2o` choice (heavy hitters + recent) among the rest.

StreamingLLM's attention sinks combined with H2O's heavy hitters; storage and attention are the
h2o policy's (see h2o.py), with the first `sink` ranks never evicted.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..quant.codes import GROUP
from .base import register_policy
from .h2o import QuantizedHeavyHitterPolicy


@register_policy
@dataclass(frozen=True)
class SinkH2O(QuantizedHeavyHitterPolicy):
    name = "sink_h2o"
    sink: int = 4
    heavy: int = 124
    recent: int = 128
    kv_bits: int = 16
    group: int = GROUP

    @property
    def sinks_kept(self) -> int:
        return self.sink
