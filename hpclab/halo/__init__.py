"""Convolution layers split by height across ranks, with halo exchange (notebook 06).

- ``conv``: the kernels of an AlexNet block (the plain convolution kernel to read, max-pooling,
  LRN) and the choice of convolution method; ``reference``: their NumPy twins
- ``conv_tiled``, ``conv_gemm``, ``conv_winograd``: the faster convolutions (tiled direct,
  im2col + GEMM, Winograd), the topic's advanced part
- ``geometry``: which output rows each rank owns, which input rows (and halo) it needs
- ``layers``, ``alexnet``: the layers of a chain, and AlexNet's with the layer table
- ``executors`` (with ``bands``, ``streams``): run a chain on bands, on the host (NumPy) or the GPU
- ``versions``: the five versions (serial, MPI CPUs, one GPU, MPI + GPU, GPU-to-GPU) and their checks
- ``figures``: the band picture and the scaling figure
- ``run``, ``check``, ``bench``: ``hpclab run conv-halo``, the exercise's checks, ``hpclab bench conv``
"""
