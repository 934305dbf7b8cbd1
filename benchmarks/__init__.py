"""The performance lab: what measures and records the workbook's own performance on GPUs.

Run from a checkout (it is not part of the installed ``hpclab`` package): ``python -m benchmarks NAME``
(``pi``, ``matmul``, ``allreduce``, ``conv``, ``ddp``; ``-h`` for each one's options), ``make bench`` for the
whole GPU suite, ``python benchmarks/record.py`` and ``benchmarks/curate.py`` to add results to the curated
tables. Each driver uses the library's kernels and measurements (``hpclab.<topic>``) and adds what only the
records need: tile sweeps, register and SASS counts, comparisons with cuBLAS, cuDNN and raw NCCL, targets.
"""
