"""Under mpiexec -n 3: the same training on 1, 2 and 3 ranks in one launch, by sub-communicators.

Prints one JSON line (rank 0): for each run its losses, replica check and
batch split, plus a throughput scaling sweep over 1, 2, 3 ranks.
"""
import json

from mpi4py import MPI

from hpclab import backend

backend.select()
from hpclab.ddp import throughput  # noqa: E402
from hpclab.ddp.synthetic_training import SyntheticConfig, train_synthetic  # noqa: E402
from hpclab.mpi import world  # noqa: E402

KEYS = ("losses", "epoch_losses", "replicas_identical", "global_batch", "per_rank_batch",
        "steps_per_epoch", "lr", "learned", "finite")


def first(comm, k):
    """The first k ranks as a communicator (COMM_NULL elsewhere)."""
    return comm.Split(0 if comm.rank < k else MPI.UNDEFINED, comm.rank)


def on(sub, cfg):
    if sub == MPI.COMM_NULL:
        return None
    out = train_synthetic(sub, cfg)
    return {k: out[k] for k in KEYS}


comm = world()
assert comm.size == 3, "run with mpiexec -n 3"
solo, pair = first(comm, 1), first(comm, 2)
# The ddp-mlp program's defaults (float64), at global batch 32: 1 and 2 ranks.
b32 = SyntheticConfig(global_batch=32, epochs=2, samples=256)
# float32, a batch that divides by 3: 1 and 3 ranks.
b48 = SyntheticConfig(global_batch=48, epochs=1, samples=240, dtype="float32")
runs = {
    "b32_1": on(solo, b32), "b32_2": on(pair, b32),
    "b48_1": on(solo, b48), "b48_3": on(comm, b48),
    # per-rank batch fixed at 16: 3 ranks train on a global batch of 48
    "per16_3": on(comm, SyntheticConfig(per_rank_batch=16, epochs=1, samples=240)),
    "per16_3_scaled": on(comm, SyntheticConfig(per_rank_batch=16, epochs=1, samples=240,
                                              scale_lr=True)),
}
# Overlapped all-reduce of gradient buckets on 2 ranks: one bucket per layer (a tiny bucket
# size), layers 1-2 together and 0 alone (100 bytes), everything in one bucket (25 MiB).
for name, mb in (("per_layer", 1e-9), ("two", 100 / 2 ** 20), ("one", 25.0)):
    runs[f"b32_2_overlap_{name}"] = on(pair, SyntheticConfig(global_batch=32, epochs=2, samples=256,
                                                            overlap=True, bucket_mb=mb))
rows = throughput.scaling(comm, [6, 4, 2], [1, 2, 3], global_batch=12, steps=1, warmup=1)
if comm.rank == 0:
    print(json.dumps({"runs": runs, "scaling": rows}), flush=True)
