"""The names of the built-in evaluation rows, in the order tables list them: torch-free, so that the
CLI's `--help` names them without loading a model's machinery. row_kinds.py registers one kind per name."""

ROW_NAMES = ("full", "duo", "streaming", "h2o", "random", "snapkv", "mix")
