"""Convolution layers split by height across ranks, with halo exchange (notebook 06); the README's layout
section names each module's part."""
