"""The workshop's Exercises 5 and 6 in PyTorch: ``python -m hpclab.ddp.torch_ddp`` under mpiexec, srun, torchrun.

It joins one process group (:func:`setup`), checks that ``DistributedDataParallel`` gives the gradients of
the workbook's own DDP on the 6 -> 4 -> 2 MLP (:func:`compare_gradients`) and trains Exercise 6's CNN on
the digits (:func:`train_cnn`). PyTorch is optional (:func:`available`). NCCL with a GPU per rank, else gloo.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import socket
import sys

import numpy as np

from hpclab.ddp import mlp as K
from hpclab.ddp.data import digits, synthetic
from hpclab.ddp.model import MLP, init_parameters, unflatten
from hpclab.ddp.trainer import DDPTrainer
from hpclab.decomp import block_range
from hpclab.device import local_rank, select_gpu
from hpclab.mpi import MPI, world

try:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.utils.data import DataLoader, DistributedSampler, TensorDataset
except ImportError:
    torch = None

THRESHOLD = 0.95          # test accuracy the CNN must reach
GRAD_RTOL = 1e-13         # largest gradient difference allowed, relative to the largest gradient


def available() -> tuple[bool, str]:
    return (False, "PyTorch is not installed here (pip install torch): the PyTorch cells are skipped") \
        if torch is None else (True, f"PyTorch {torch.__version__}")


def rendezvous(comm=None, env=os.environ) -> dict:
    """Rank, local rank, world size (from torchrun's variables, else MPI, else Slurm) and rank 0's address
    (``MASTER_ADDR``/``PORT``, else over MPI, else the workshop's rule: first node, ``29500 + job id % 20000``)."""
    if comm is None and "RANK" not in env:
        comm = world() if world().size > 1 or "SLURM_PROCID" not in env else None
    if "RANK" in env:
        rank, size, local, local_size, how = (int(env["RANK"]), int(env["WORLD_SIZE"]), int(env.get("LOCAL_RANK", 0)),
                                              int(env.get("LOCAL_WORLD_SIZE", 1)), "torchrun")
    elif comm is not None:
        (local, local_size), rank, size, how = local_rank(comm), comm.rank, comm.size, "MPI"
    else:
        rank, size, local = int(env["SLURM_PROCID"]), int(env["SLURM_NTASKS"]), int(env["SLURM_LOCALID"])
        local_size, how = int(env.get("SLURM_NTASKS_PER_NODE", "1").split("(")[0]), "Slurm"
    if "MASTER_ADDR" in env and "MASTER_PORT" in env:
        addr, port = env["MASTER_ADDR"], int(env["MASTER_PORT"])
    elif how == "MPI":
        with socket.socket() as s:                                   # rank 0 picks a free port
            s.bind(("", 0))
            addr, port = comm.bcast((socket.gethostname(), s.getsockname()[1]) if rank == 0 else None, root=0)
        addr = "127.0.0.1" if local_size == size else addr          # one node: loopback
    else:                                                            # the job's first node: gpu[07-08] -> gpu07
        m = re.match(r"([^\[,]+)(?:\[(\d+))?", env["SLURM_JOB_NODELIST"])
        addr, port = m.group(1) + (m.group(2) or ""), 29500 + int(env["SLURM_JOB_ID"]) % 20000
    return {"rank": rank, "world_size": size, "local_rank": local, "local_size": local_size,
            "master_addr": addr, "master_port": port, "from": how}


def setup(comm=None) -> dict:
    """Join the process group (once per process); the rendezvous with ``device`` and ``backend`` added."""
    r = rendezvous(comm)
    gpus = torch.cuda.device_count()
    r["device"] = torch.device("cuda", r["local_rank"] % gpus) if gpus else torch.device("cpu")
    if gpus:
        torch.cuda.set_device(r["device"])          # before init_process_group, as the workshop says
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // r["local_size"]))    # ranks of a node share its cores
    r["backend"] = "nccl" if gpus >= r["local_size"] else "gloo"      # NCCL refuses two ranks on one GPU
    if not dist.is_initialized():                    # rank 0's IPv4 address, as the workshop's script resolves it
        os.environ.update(MASTER_ADDR=socket.gethostbyname(r["master_addr"]), MASTER_PORT=str(r["master_port"]))
        dist.init_process_group(r["backend"], rank=r["rank"], world_size=r["world_size"],
                                device_id=r["device"] if r["backend"] == "nccl" else None)
    return r


def cleanup() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def _wrap(model, info, data, batch: int, seed: int):
    """DDP around the model (it broadcasts rank 0's weights) and a loader of this rank's share of the data."""
    dev = info["device"]
    ddp = DDP(model.to(dev), device_ids=[dev.index] if dev.type == "cuda" else None)
    sampler = DistributedSampler(data, num_replicas=info["world_size"], rank=info["rank"], shuffle=True, seed=seed)
    return ddp, sampler, DataLoader(data, batch_size=batch, sampler=sampler)


def compare_gradients(info: dict, comm, steps: int = 3, global_batch: int = 32, seed: int = 0,
                      lr: float = 0.05) -> dict:
    """PyTorch DDP against the workbook's DDP on the 6 -> 4 -> 2 MLP: ``steps`` SGD steps in float64,
    the same weights, data and batches, each rank the rows PyTorch's sampler gives it."""
    select_gpu(comm)                                            # Numba on this rank's GPU
    sizes, dev, per_rank = [6, 4, 2], info["device"], max(1, global_batch // info["world_size"])
    x, y = synthetic(256, seed=seed)
    flat = init_parameters(sizes, seed=seed, dtype=np.float64)
    net = torch.nn.Sequential(torch.nn.Linear(6, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2)).double()
    with torch.no_grad():                     # hpclab keeps W as (in, out), PyTorch as (out, in)
        for layer, (w, b) in zip(net[::2], unflatten(flat, sizes)):
            layer.weight.copy_(torch.from_numpy(w.T)), layer.bias.copy_(torch.from_numpy(b))
    ddp, sampler, loader = _wrap(net, info, TensorDataset(torch.from_numpy(x), torch.from_numpy(y)), per_rank, seed)
    sampler.set_epoch(0)
    mine, opt = list(sampler), torch.optim.SGD(ddp.parameters(), lr=lr)

    model = MLP(sizes, np.float64)
    model.load(flat)
    trainer = DDPTrainer(model, comm, "auto", lr=lr, loss="mse")       # plain SGD, mean squared error, as here
    x_dev, y_dev, worst = K.cuda.to_device(x), K.cuda.to_device(y), 0.0
    for step, (xb, yb) in zip(range(steps), loader):
        opt.zero_grad()
        torch.nn.functional.mse_loss(ddp(xb.to(dev)), yb.to(dev)).backward()      # DDP all-reduces here
        theirs = np.concatenate([g.grad.cpu().numpy().T.ravel() for g in net.parameters()])
        opt.step()
        idx = K.cuda.to_device(np.array(mine[step * per_rank:(step + 1) * per_rank], np.int32))   # the same rows
        trainer.step(x_dev, y_dev, idx, per_rank * comm.size)
        ours = trainer.summed.copy_to_host()[:model.n_params]             # the all-reduced gradient
        worst = max(worst, float(np.abs(theirs - ours).max() / np.abs(ours).max()))
    worst = comm.allreduce(worst, op=MPI().MAX)
    return {"steps": steps, "ranks": comm.size, "max_rel_diff": worst, "passed": worst <= GRAD_RTOL,
            "via": trainer.be.name}


def digits_cnn():
    """Exercise 6's CNN shape on 8x8 images: conv 32, conv 64, max-pool, dense 256, dense 10."""
    nn = torch.nn
    return nn.Sequential(nn.Conv2d(1, 32, 3, padding=1), nn.ReLU(), nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(),
                         nn.MaxPool2d(2), nn.Dropout(0.25), nn.Flatten(), nn.Linear(64 * 4 * 4, 256), nn.ReLU(),
                         nn.Dropout(0.5), nn.Linear(256, 10))


def train_cnn(info: dict, epochs: int = 10, batch: int = 64, lr: float = 1e-3, seed: int = 0, say=print) -> dict:
    """Exercise 6 on the digits. ``batch`` is per rank, so n ranks take n times fewer steps, and the learning
    rate is scaled by n, as the workshop's slides for Exercise 6 describe (the linear scaling rule)."""
    dev, rank, size = info["device"], info["rank"], info["world_size"]
    parts = {k: (torch.from_numpy(x).reshape(-1, 1, 8, 8), torch.from_numpy(y).ravel().long())
             for k, (x, y) in digits(seed=seed).items()}
    torch.manual_seed(seed)
    ddp, sampler, loader = _wrap(digits_cnn(), info, TensorDataset(*parts["train"]), batch, seed)
    opt = torch.optim.Adam(ddp.parameters(), lr=lr * size)

    def accuracy(x, y):                       # each rank its block of rows; the counts summed over ranks
        a, b = block_range(len(y), size, rank)
        ddp.eval()
        with torch.no_grad():
            right = (ddp(x[a:b].to(dev)).argmax(1) == y[a:b].to(dev)).sum().double()
        dist.all_reduce(right)
        return right.item() / len(y)

    for epoch in range(epochs):
        sampler.set_epoch(epoch)               # a new order every epoch, the same on every rank
        ddp.train()
        for xb, yb in loader:
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(ddp(xb.to(dev)), yb.to(dev))
            loss.backward()
            opt.step()
        say(f"Epoch {epoch + 1}/{epochs} | last loss {loss.item():.4f} | val acc {100 * accuracy(*parts['val']):.2f}%")
    test = accuracy(*parts["test"])
    return {"epochs": epochs, "test_accuracy": test, "threshold": THRESHOLD, "passed": test >= THRESHOLD,
            "ranks": size, "train_images": len(parts["train"][1]), "per_rank_batch": batch, "lr": lr * size}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hpclab.ddp.torch_ddp", description=__doc__.split("\n\n")[0])
    parser.add_argument("--epochs", type=int, default=10)
    args = parser.parse_args(argv)
    if torch is None:
        return print(available()[1], file=sys.stderr) or 1
    comm = world()
    info = setup(comm if comm.size > 1 else None)
    say = print if info["rank"] == 0 else (lambda *a: None)
    say(f"PyTorch DDP, {info['world_size']} rank(s): {info['backend']} on {info['device']}, ranks from {info['from']}")
    grads = (compare_gradients(info, comm) if comm.size == info["world_size"]
             else {"passed": False, "why": "the gradient check needs MPI with one rank per process"})
    say(f"gradients, PyTorch DDP against hpclab's DDP: largest relative difference "
        f"{grads.get('max_rel_diff', float('nan')):.1e} (allowed {GRAD_RTOL:g})")
    cnn = train_cnn(info, args.epochs, say=say)
    say(f"test accuracy {100 * cnn['test_accuracy']:.2f}% (threshold {100 * THRESHOLD:.0f}%)")
    passed = grads["passed"] and cnn["passed"]                  # the last line: JSON
    say(json.dumps({"gradients": grads, "cnn": cnn, "passed": passed, "ranks": comm.size}))
    cleanup()
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
