"""Matrix multiply (notebook 04), kernels in teaching order: naive, tiled, fast, warp; docs/architecture.md names
each module's part."""
