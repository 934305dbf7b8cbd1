"""hpclab.pi."""
