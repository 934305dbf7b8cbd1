"""Convolution layers split by height across ranks, with halo exchange.

- ``geometry``: which output rows each rank owns, which input rows (and halo) it needs
- ``executors``: run a chain of layers on a band, on the host (NumPy) or the GPU
- ``versions``: the five versions (serial, MPI CPUs, one GPU, MPI + GPU, GPU-to-GPU) and their checks
- ``alexnet``: AlexNet's layers and the layer table
- ``figures``: the band picture and the scaling figure
"""
