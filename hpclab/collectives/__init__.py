"""Collectives on GPU data (notebooks 00 and 01, workshop Exercise 0): ``kernels`` (fill, hello), ``patterns`` (the
eight patterns on each rank's [rank + 1]), ``ring`` (a ring all-reduce by hand), ``check``, and the program ``run``."""
