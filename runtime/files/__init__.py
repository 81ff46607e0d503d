"""Files on disk: atomic writes, outputs checked before the work, regular-file reads, one writer per folder."""
