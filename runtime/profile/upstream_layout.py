"""The file names of an upstream DuoAttention pattern folder (mit-han-lab/duo-attention `attn_patterns/`)."""

TSV_NAME = "full_attention_heads.tsv"  # one row per layer, one raw gate per KV head
CONFIG_NAME = "config.json"  # the model's shape and the training settings
