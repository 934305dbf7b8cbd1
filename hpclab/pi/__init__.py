"""Pi on every rank's GPU (notebooks 02 and 03, workshop Exercises 1 and 2): the lesson's kernels ``midpoint``, ``mc``
(Monte Carlo, counter-based Philox generator) and ``reduce`` (the block sum both use); ``fast``, their faster forms
that the programs and ``benchmarks/pi.py`` time; ``xoroshiro``, the workshop's generator, for comparison; ``check``, error
bounds and the exercise checks; the programs ``run_midpoint`` and ``run_mc`` (with ``program``); ``measure``
(notebook 02's roofline points).
"""
