"""Where each `hpclab run` program and `hpclab bench` benchmark lives: one topic package per
notebook (collectives 00-01, pi 02-03, matmul 04, comm 05, halo 06, ddp 07)."""

PROGRAMS = {
    "collectives": "hpclab.collectives.run",
    "pi-midpoint": "hpclab.pi.run_midpoint",
    "pi-mc": "hpclab.pi.run_mc",
    "matmul-reduce": "hpclab.matmul.run_reduce",
    "matmul": "hpclab.matmul.run_matmul",
    "pi-nccl-node": "hpclab.comm.run_pi_nccl_node",
    "pi-nccl-mpi": "hpclab.comm.run_pi_nccl_mpi",
    "conv-halo": "hpclab.halo.run",
    "ddp-mlp": "hpclab.ddp.run_mlp",
    "ddp-digits": "hpclab.ddp.run_digits",
}

BENCHMARKS = {
    "pi": "hpclab.pi.bench",
    "matmul": "hpclab.matmul.bench",
    "allreduce": "hpclab.comm.bench",
    "conv": "hpclab.halo.bench",
    "ddp": "hpclab.ddp.bench",
}
