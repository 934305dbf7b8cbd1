"""Under mpiexec -n 2 on two GPUs: overlapped steps with NCCL, with NCCL's default CTAs and with every bucket
but the last summed by a communicator of at most 2 CTAs, against the plain step. A sum of two numbers is the
same in any order, so the weights must agree bit for bit. Prints one JSON line (rank 0)."""
import json

import numpy as np

from hpclab import backend

backend.select("gpu")
from hpclab.ddp.model import MLP, init_parameters  # noqa: E402
from hpclab.ddp.trainer import DDPTrainer, random_batch, replica_checksums  # noqa: E402
from hpclab.device import select_gpu  # noqa: E402
from hpclab.mpi import world  # noqa: E402

from benchmarks.nccl_ctas import HiddenAllreduce  # noqa: E402

comm = world()
select_gpu(comm)
sizes = [512, 1024, 256, 10]
runs = []
for overlap, ctas in ((False, None), (True, None), (True, 2)):
    model = MLP(sizes)
    hidden = HiddenAllreduce(ctas) if ctas else None
    model.load(init_parameters(sizes, seed=0))
    trainer = DDPTrainer(model, comm, "nccl", optimizer="sgd", lr=1e-3, momentum=0.9, overlap=overlap,
                         bucket_mb=0.5, first_layer_slices=2, hidden_allreduce=hidden)
    batch = random_batch(comm, sizes, 128)
    losses = [trainer.step(*batch, 128 * comm.size)[0] for _ in range(3)]
    runs.append({"losses": losses, "weights": model.parameters_host(), "comm": trainer.be.name,
                 "ctas": ctas if hidden and hidden.used else None, "buckets": len(trainer.buckets) if overlap else 1,
                 "identical": replica_checksums(comm, model)["identical"]})
if comm.rank == 0:
    plain = runs[0]
    print(json.dumps({"runs": [{k: v for k, v in r.items() if k != "weights"} for r in runs],
                      "same_as_plain": [bool(np.array_equal(r["weights"], plain["weights"]) and
                                             r["losses"] == plain["losses"]) for r in runs[1:]],
                      "trained": bool(not np.array_equal(plain["weights"], init_parameters(sizes, seed=0)))}))
