"""Convolution layers split by height across ranks, with halo exchange (notebook 06); docs/architecture.md
names each module's part."""
