"""Matrix multiply (notebook 04), kernels in teaching order: naive.py, tiled.py (shared-memory tiles),
fast.py (register blocking: the general kernel, and the matmul()/launch() entry point for all three);
run_reduce.py and run_matmul.py (`hpclab run matmul-reduce`, `matmul`), check.py, measure.py (what notebook 04
times on the engines; benchmarks/matmul.py sweeps tile shapes against cuBLAS)."""
