"""Under mpiexec -n N (2 or 3): notebook 08's machinery on N ranks, one JSON line from rank 0.

ZeRO-1 against DDP over a few Adam steps (float64), the memory each holds, both tensor-parallel splits,
the pipelined forward pass, and bad input (a split that does not divide, fewer parameters than ranks).
"""
import json

import numpy as np

from hpclab import backend

backend.select()
from hpclab import comm as hcomm  # noqa: E402
from hpclab.beyond import pipeline, tensor, zero  # noqa: E402
from hpclab.ddp import MLP, DDPTrainer, DistributedSampler, init_parameters  # noqa: E402
from hpclab.ddp import mlp as K  # noqa: E402
from hpclab.ddp.data import synthetic  # noqa: E402
from hpclab.errors import RankError  # noqa: E402
from hpclab.mpi import world  # noqa: E402

comm = world()
rank, size = comm.rank, comm.size
be = hcomm.get("auto", comm, quiet=True)
sizes, steps = [6, 8, 4, 2], 3                    # 102 parameters: padded to 104 on 4 ranks, 102 on 2 and 3
x, y = synthetic(96)
x_dev, y_dev = K.cuda.to_device(x), K.cuda.to_device(y)
idx = DistributedSampler(96, 24, rank, size).indices(0)
runs = {}
for name in ("ddp", "zero"):
    model = MLP(sizes, np.float64)
    model.load(init_parameters(sizes, seed=rank))   # different per rank: the broadcast makes them one
    trainer = (DDPTrainer(model, comm, be, optimizer="adam", lr=0.01, loss="mse") if name == "ddp"
               else zero.ZeroTrainer(model, comm, be, lr=0.01))
    losses = [trainer.step(x_dev, y_dev, K.cuda.to_device(idx[s]), 24)[0] for s in range(steps)]
    runs[name] = {"weights": model.parameters_host().tolist(), "losses": losses, "held": zero.held_bytes(trainer)}

rng = np.random.default_rng(1)
X = rng.standard_normal((8, 12)).astype(np.float32)
W = rng.standard_normal((12, 6 * size)).astype(np.float32)
Y = {"columns": tensor.column_parallel(be, X, W).tolist(), "rows": tensor.row_parallel(be, X, W).tolist()}

errors = {}
for what, bad in (("columns", lambda: tensor.column_parallel(be, X, W[:, :6 * size - 1])),
                  ("sharding", lambda: zero.ZeroTrainer(MLP([1, 1]), comm, be))):
    try:
        bad()
    except (RankError, ValueError) as exc:
        errors[what] = f"{type(exc).__name__}: {exc}"

layers = [5, 7, 4, 3][:size + 1]
piped = pipeline.forward(be, layers, x[:10, :5].copy(), micro=4)
times = comm.allgather(pipeline.stage_times(layers, rank, rows=4, repeats=2))
everyone = comm.gather({"runs": runs, "Y": Y, "errors": errors}, root=0)
if rank == size - 1:
    comm.send(piped.tolist(), dest=0)
if rank == 0:
    print(json.dumps({"size": size, "ranks": everyone, "X": X.tolist(), "W": W.tolist(), "layers": layers,
                      "x": x[:10, :5].tolist(), "piped": comm.recv(source=size - 1), "times": times}), flush=True)
