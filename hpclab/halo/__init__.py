"""Convolution layers split by height across ranks, with halo exchange (notebook 06): the kernel to
read and its NumPy twins (``conv``, ``reference``), the faster methods (``conv_tiled``, ``conv_gemm``,
``conv_winograd``), the band geometry, AlexNet's layers, the executors and the five versions that run
them, the ``conv-halo`` program, the exercise's checks and ``hpclab bench conv``.
"""
