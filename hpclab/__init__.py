"""hpclab: a workbook on distributed GPU computing with Numba, MPI and NCCL.

The backend (a real GPU or Numba's CUDA simulator) is decided by ``hpclab.backend.select()`` before
``numba.cuda`` loads: import hpclab modules before ``numba.cuda``.
"""
__version__ = "0.1.0"
