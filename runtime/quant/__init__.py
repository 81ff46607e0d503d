"""KV codes (KIVI, 8/4 bits) of full heads: the codes, attention over them, C kernels, transformers baselines."""
