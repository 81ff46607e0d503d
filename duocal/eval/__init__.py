"""Evaluation through the per-head KV cache (passkey retrieval, perplexity), and where retrieval happens."""

from duocal.eval.models import load_model, load_tokenizer
from duocal.eval.passkey import POLICIES, PasskeyEvalConfig, PasskeyRow, evaluate_passkey
from duocal.eval.retrieval_heads import find_retrieval_heads, flat_indices, needle_attention, top_heads

__all__ = [
    "POLICIES", "PasskeyEvalConfig", "PasskeyRow", "evaluate_passkey", "find_retrieval_heads", "flat_indices",
    "load_model", "load_tokenizer", "needle_attention", "top_heads",
]
