"""Pi on every rank's GPU (notebooks 02 and 03, workshop Exercises 1 and 2).

The lesson's kernels: ``midpoint`` (the midpoint rule), ``mc`` (Monte Carlo with the
counter-based Philox generator), ``reduce`` (the block sum both use). Their faster forms,
which the programs and the benchmark time: ``fast``. Other generators for comparison:
``xoroshiro`` (notebook 03). Error bounds and the exercise
checks: ``check``. Programs: ``run_midpoint``, ``run_mc`` (with ``program``); ``bench``.
"""
