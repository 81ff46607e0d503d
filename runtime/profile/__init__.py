"""The profile format: model shape, scores, measurements, deployment defaults, upstream patterns.

The numbers and names below need no torch (format.py and upstream.py do), so that `duocal profile --help` and
`duocal profiles import` say them before anything heavy loads."""

VERSION = 3  # written: deploy sizes per policy ("sizes": {policy: {field: tokens}})
# read too: 1 (flat deploy sizes shared between policies), 2 (1 + "measurements"; see profile/measurements.py)
READABLE_VERSIONS = (1, 2, VERSION)

# The file names of an upstream DuoAttention pattern folder (mit-han-lab/duo-attention `attn_patterns/`).
TSV_NAME = "full_attention_heads.tsv"  # one row per layer, one raw gate per KV head
CONFIG_NAME = "config.json"  # the model's shape and the training settings
