"""hpclab.collectives."""
