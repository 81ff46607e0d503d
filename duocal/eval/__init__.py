"""Evaluation through the per-head KV cache (passkey retrieval, perplexity), and where retrieval happens."""

from duocal.eval.passkey_retrieval import PasskeyEvalConfig, PasskeyRow, evaluate_passkey
from duocal.eval.perplexity import PerplexityConfig, PerplexityRow, evaluate_perplexity
from duocal.eval.retrieval_heads import find_retrieval_heads, flat_indices, needle_attention, top_heads
from duocal.eval.row_kinds import ROWS, register_row

__all__ = [
    "ROWS",
    "PasskeyEvalConfig",
    "PasskeyRow",
    "PerplexityConfig",
    "PerplexityRow",
    "evaluate_passkey",
    "evaluate_perplexity",
    "find_retrieval_heads",
    "flat_indices",
    "needle_attention",
    "register_row",
    "top_heads",
]
