"""Benchmarks run by ``hpclab bench NAME``: one module per benchmark with ``main(argv) -> int``."""
