"""`duocal serve`: an OpenAI-compatible endpoint with continuous batching on duocal's paged cache."""
