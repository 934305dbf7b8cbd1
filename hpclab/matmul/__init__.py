"""hpclab.matmul."""
