"""What duocal shows people: profile summaries and comparisons, plots, model cards, sizes."""
