"""Numba CUDA kernels, one module per workshop topic.

Each module gets ``cuda`` from :func:`hpclab.backend.cuda`, so importing a
kernel module decides the backend first.
"""
