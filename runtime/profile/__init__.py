"""The profile format: model shape, scores, measurements, deployment defaults, upstream patterns."""
