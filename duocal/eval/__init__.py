"""Evaluation through the per-head KV cache (passkey retrieval, perplexity), and where retrieval happens."""

from duocal.eval.models import load_model, load_tokenizer
from duocal.eval.passkey import PasskeyEvalConfig, PasskeyRow, evaluate_passkey
from duocal.eval.perplexity import PerplexityConfig, PerplexityRow, evaluate_perplexity
from duocal.eval.variants import ROW_KINDS
from duocal.eval.retrieval_heads import find_retrieval_heads, flat_indices, needle_attention, top_heads

__all__ = [
    "ROW_KINDS", "PasskeyEvalConfig", "PasskeyRow", "PerplexityConfig", "PerplexityRow", "evaluate_passkey",
    "evaluate_perplexity", "find_retrieval_heads", "flat_indices",
    "load_model", "load_tokenizer", "needle_attention", "top_heads",
]
