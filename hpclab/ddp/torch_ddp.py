"""The workshop's Exercises 5 and 6 in PyTorch: the script learners write after notebook 07.

``python -m hpclab.ddp.torch_ddp`` under ``mpiexec``, ``srun`` or ``torchrun``: every rank joins one
process group (rank, world size, ``MASTER_ADDR``/``MASTER_PORT`` from the launcher), binds its GPU
with ``torch.cuda.set_device(local_rank)`` before ``init_process_group``, then

1. checks that PyTorch's ``DistributedDataParallel`` gives the gradients of the workbook's own DDP
   (``hpclab.ddp``, Numba kernels) for the 6 -> 4 -> 2 MLP: same weights, data, seed, batches and
   ranks, float64, compared step by step (needs MPI for the workbook's side);
2. trains Exercise 6's CNN (two 3x3 convolutions, max-pool, two dense layers) on scikit-learn's
   8x8 digits with ``DistributedSampler`` and ``set_epoch``, and reports the test accuracy.

PyTorch is optional: :func:`available` says whether it imports. NCCL on GPUs (one per rank), gloo on
the CPU and where ranks share a GPU.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import socket
import sys

import numpy as np

THRESHOLD = 0.95          # test accuracy the CNN must reach
GRAD_RTOL = 1e-13         # largest gradient difference allowed, relative to the largest gradient


def available() -> tuple[bool, str]:
    try:
        import torch
    except ImportError:
        return False, "PyTorch is not installed here (pip install torch): the PyTorch cells are skipped"
    return True, f"PyTorch {torch.__version__}"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def _first_host(nodelist: str) -> str:
    """The first host of a Slurm node list: ``gpu[07-08,11]`` -> ``gpu07``."""
    m = re.match(r"([^\[,]+)(?:\[(\d+))?", nodelist)
    return m.group(1) + (m.group(2) or "")


def rendezvous(comm=None, env=os.environ) -> dict:
    """Rank, local rank, world size and the address of rank 0's store, from the launcher.

    torchrun's variables first, else MPI (``comm``, or the world when it has several ranks), else
    Slurm's, else one process. Address and port: ``MASTER_ADDR``/``MASTER_PORT`` if set, else rank 0's
    host and a free port sent over MPI, else the workshop's Slurm rule (the job's first node,
    ``29500 + job id % 20000``), else this host.
    """
    if comm is None and "RANK" not in env:
        from hpclab.mpi import world
        comm = world() if world().size > 1 or "SLURM_PROCID" not in env else None
    if "RANK" in env:
        rank, size, local, local_size, how = (int(env["RANK"]), int(env["WORLD_SIZE"]), int(env.get("LOCAL_RANK", 0)),
                                              int(env.get("LOCAL_WORLD_SIZE", 1)), "torchrun")
    elif comm is not None:
        from hpclab.device import local_rank
        (local, local_size), rank, size, how = local_rank(comm), comm.rank, comm.size, "MPI"
    else:
        rank, size, local = int(env["SLURM_PROCID"]), int(env["SLURM_NTASKS"]), int(env["SLURM_LOCALID"])
        local_size, how = int(env.get("SLURM_NTASKS_PER_NODE", "1").split("(")[0]), "Slurm"
    if "MASTER_ADDR" in env and "MASTER_PORT" in env:
        addr, port = env["MASTER_ADDR"], int(env["MASTER_PORT"])
    elif comm is not None and how == "MPI":
        addr, port = comm.bcast((socket.gethostname(), _free_port()) if rank == 0 else None, root=0)
        addr = "127.0.0.1" if local_size == size else addr          # one node: loopback
    elif "SLURM_JOB_NODELIST" in env:
        addr, port = _first_host(env["SLURM_JOB_NODELIST"]), 29500 + int(env["SLURM_JOB_ID"]) % 20000
    else:
        addr, port = "127.0.0.1", _free_port()
    return {"rank": rank, "world_size": size, "local_rank": local, "local_size": local_size,
            "master_addr": addr, "master_port": port, "from": how}


def setup(comm=None) -> dict:
    """Join the process group (once per process); returns the rendezvous with device and backend."""
    import torch
    import torch.distributed as dist

    r = rendezvous(comm)
    gpus = torch.cuda.device_count()
    if gpus:
        r["device"] = torch.device("cuda", r["local_rank"] % gpus)
        torch.cuda.set_device(r["device"])          # before init_process_group, as the workshop says
    else:
        r["device"] = torch.device("cpu")
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // r["local_size"]))
    r["backend"] = "nccl" if gpus >= r["local_size"] else "gloo"      # NCCL refuses two ranks on one GPU
    if not dist.is_initialized():
        try:
            addr = socket.gethostbyname(r["master_addr"])              # IPv4, as the workshop resolves it
        except OSError:
            addr = r["master_addr"]
        os.environ.update(MASTER_ADDR=addr, MASTER_PORT=str(r["master_port"]))
        dist.init_process_group(r["backend"], rank=r["rank"], world_size=r["world_size"],
                                device_id=r["device"] if r["backend"] == "nccl" else None)
    return r


def cleanup() -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()


def compare_gradients(info: dict, comm, steps: int = 3, global_batch: int = 32, samples: int = 256,
                      seed: int = 0, lr: float = 0.05) -> dict:
    """PyTorch DDP against the workbook's DDP on the 6 -> 4 -> 2 MLP, ``steps`` SGD steps, float64."""
    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

    from hpclab import comm as hcomm
    from hpclab.ddp import MLP, init_parameters, mlp as K, unflatten
    from hpclab.ddp.data import synthetic

    sizes, dev = [6, 4, 2], info["device"]
    per_rank = max(1, global_batch // info["world_size"])
    global_batch = per_rank * info["world_size"]              # a multiple of the ranks
    x, y = synthetic(samples, seed=seed)
    flat = init_parameters(sizes, seed=seed, dtype=np.float64)
    net = torch.nn.Sequential(torch.nn.Linear(6, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2)).double().to(dev)
    with torch.no_grad():                     # hpclab keeps W as (in, out), PyTorch as (out, in)
        for layer, (w, b) in zip(net[::2], unflatten(flat, sizes)):
            layer.weight.copy_(torch.from_numpy(w.T)), layer.bias.copy_(torch.from_numpy(b))
    ddp = DDP(net, device_ids=[dev.index] if dev.type == "cuda" else None)
    data = TensorDataset(torch.from_numpy(x), torch.from_numpy(y))
    sampler = DistributedSampler(data, num_replicas=info["world_size"], rank=info["rank"], shuffle=True, seed=seed)
    sampler.set_epoch(0)
    loader, mine = DataLoader(data, batch_size=per_rank, sampler=sampler), list(sampler)
    opt = torch.optim.SGD(ddp.parameters(), lr=lr)

    be = hcomm.get("auto", comm)
    model = MLP(sizes, np.float64)
    model.load(flat)
    x_dev, y_dev, velocity = K.cuda.to_device(x), K.cuda.to_device(y), K.cuda.to_device(np.zeros(model.n_params))
    targets, worst = K.cuda.device_array((per_rank, 2), np.float64), 0.0
    for step, (xb, yb) in zip(range(steps), loader):
        opt.zero_grad()
        torch.nn.functional.mse_loss(ddp(xb.to(dev)), yb.to(dev)).backward()      # DDP all-reduces here
        theirs = np.concatenate([t for layer in net[::2] for t in (layer.weight.grad.T.cpu().numpy().ravel(),
                                                                    layer.bias.grad.cpu().numpy())])
        opt.step()
        idx = K.cuda.to_device(np.array(mine[step * per_rank:(step + 1) * per_rank], np.int32))   # the same rows
        K.take_rows(x_dev, idx, model.workspace(per_rank)["acts"][0])
        K.take_rows(y_dev, idx, targets)
        scale = 1.0 / (global_batch * 2)
        reduced = be.allreduce(model.loss_and_gradients(per_rank, targets, "mse", scale, scale), op="sum")
        ours = reduced.copy_to_host()[:model.n_params]
        K.sgd_update(model.params, reduced[:model.n_params], velocity, lr=lr)
        worst = max(worst, float(np.abs(theirs - ours).max() / np.abs(ours).max()))
    worst = comm.allreduce(worst, op=__import__("mpi4py").MPI.MAX)
    return {"steps": steps, "ranks": info["world_size"], "max_rel_diff": worst, "passed": worst <= GRAD_RTOL,
            "numba_comm": be.name, "torch_backend": info["backend"]}


def digits_cnn():
    """Exercise 6's CNN shape on 8x8 images: conv 32, conv 64, max-pool, dense 256, dense 10."""
    from torch import nn

    return nn.Sequential(nn.Conv2d(1, 32, 3, padding=1), nn.ReLU(), nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(),
                         nn.MaxPool2d(2), nn.Dropout(0.25), nn.Flatten(), nn.Linear(64 * 4 * 4, 256), nn.ReLU(),
                         nn.Dropout(0.5), nn.Linear(256, 10))


def train_cnn(info: dict, epochs: int = 10, batch: int = 64, lr: float = 1e-3, seed: int = 0, say=print) -> dict:
    """Exercise 6 on the digits: DDP, a DistributedSampler reshuffled each epoch, accuracy summed over ranks.

    ``batch`` is per rank, so n ranks take n times fewer steps; the learning rate is scaled by n, as the
    slides for the workshop's Exercise 6 describe (the linear scaling rule).
    """
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

    from hpclab.ddp.data import digits
    from hpclab.decomp import block_range

    dev, rank, size = info["device"], info["rank"], info["world_size"]
    parts = {k: (torch.from_numpy(x).reshape(-1, 1, 8, 8), torch.from_numpy(y).ravel().long())
             for k, (x, y) in digits(seed=seed).items()}
    torch.manual_seed(seed)
    ddp = DDP(digits_cnn().to(dev), device_ids=[dev.index] if dev.type == "cuda" else None)
    train = TensorDataset(*parts["train"])
    sampler = DistributedSampler(train, num_replicas=size, rank=rank, shuffle=True, seed=seed)
    loader = DataLoader(train, batch_size=batch, sampler=sampler)
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
        val = accuracy(*parts["val"])
        if rank == 0:
            say(f"Epoch {epoch + 1}/{epochs} | last batch loss {loss.item():.4f} | val acc {100 * val:.2f}%")
    test = accuracy(*parts["test"])
    return {"epochs": epochs, "test_accuracy": test, "threshold": THRESHOLD, "passed": test >= THRESHOLD,
            "ranks": size, "train_images": len(train), "per_rank_batch": batch, "lr": lr * size}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hpclab.ddp.torch_ddp", description=__doc__.split("\n\n")[0])
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--steps", type=int, default=3, help="SGD steps of the gradient comparison")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    ok, why = available()
    if not ok:
        print(why, file=sys.stderr)
        return 1
    from hpclab.mpi import world

    comm = world()
    info = setup(comm if comm.size > 1 else None)
    say = print if info["rank"] == 0 else (lambda *a: None)
    say(f"PyTorch DDP on {info['world_size']} rank(s), {info['backend']} on {info['device']} "
        f"(rank and address from {info['from']})")
    grads = (compare_gradients(info, comm, args.steps) if comm.size == info["world_size"]
             else {"passed": False, "why": "the gradient check needs MPI with one rank per process"})
    say(f"gradients, PyTorch DDP vs hpclab's DDP: max relative difference {grads.get('max_rel_diff', float('nan')):.1e}"
        f" over {args.steps} steps (allowed {GRAD_RTOL:g})")
    cnn = train_cnn(info, args.epochs, say=say)
    say(f"test accuracy {100 * cnn['test_accuracy']:.2f}% (threshold {100 * THRESHOLD:.0f}%)")
    passed = grads["passed"] and cnn["passed"]
    if args.json:
        say(json.dumps({"gradients": grads, "cnn": cnn, "passed": passed, "ranks": info["world_size"],
                        "backend": info["backend"], "device": str(info["device"])}))
    cleanup()
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
