"""Files on disk: atomic writes, regular-file reads, one writer per folder."""
