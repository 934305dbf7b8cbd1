"""Workshop programs run by ``hpclab run NAME`` (one module per program)."""
