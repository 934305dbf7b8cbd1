"""Record the roofline and the timelines that notebooks 02, 04, 06 and 07 show on the simulator, in the
format of hpclab/data/roofline.csv or hpclab/data/timeline.csv (copy FILE there to show it).

    python benchmarks/perf_record.py roofline FILE                # one GPU: the roofs and the notebooks' kernels
    mpiexec -n 2 python benchmarks/perf_record.py timeline FILE   # a DDP step and a halo layer, with and
                                                                  # without overlap, one GPU per rank
"""
import csv
import datetime
import sys
from dataclasses import asdict, fields
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))   # run as a script: `benchmarks` importable
from hpclab import backend, roofline  # noqa: E402


def write_roofline(points: list, fh) -> None:
    """``roofline.Point`` rows, the columns of data/roofline.csv (:func:`hpclab.roofline.read`)."""
    w = csv.DictWriter(fh, [f.name for f in fields(roofline.Point)])
    w.writeheader()
    w.writerows({k: (f"{v:.7g}" if isinstance(v, float) else v) for k, v in asdict(p).items()} for p in points)


def write_timeline(runs: dict[str, list[dict]], device: str, fh) -> None:
    """Every run's spans, the columns of data/timeline.csv (:func:`hpclab.timeline.read`)."""
    w = csv.DictWriter(fh, ["run", "device", "date", "rank", "lane", "kind", "name", "start_ms", "end_ms"])
    w.writeheader()
    today = datetime.date.today().isoformat()
    w.writerows({**s, "run": run, "device": device, "date": today, "start_ms": f"{s['start_ms']:.4f}",
                 "end_ms": f"{s['end_ms']:.4f}"} for run, spans in runs.items() for s in spans)


def record_roofline(path: str) -> None:
    from hpclab.halo.measure import roofline_points as conv
    from hpclab.matmul.measure import measure, roofline_points as matmul, split_k_points
    from hpclab.pi.measure import roofline_points as pi

    from benchmarks import conv_direct

    n = backend.auto_size(gpu=4096, sim=32)
    points = roofline.measure_roofs() + pi() + matmul(n, measure(n, repeats=5)) + conv()
    points.append(conv_direct.roofline_point())    # notebook 06's tiled direct kernel lives with the benchmarks
    points += split_k_points() if not backend.is_simulator() else []   # (the simulator: hours at that shape)
    for p in points:
        p.command = "python benchmarks/perf_record.py roofline FILE"
    with open(path, "w", newline="") as fh:
        write_roofline(points, fh)


def record_timeline(path: str) -> None:
    from hpclab.ddp.trainer import timeline_step
    from hpclab.device import identity, select_gpu
    from hpclab.halo.versions import timeline_layer
    from hpclab.mpi import world

    comm = world()
    select_gpu(comm)            # one GPU per rank where there are enough
    runs = {f"{what}, {'overlapped' if overlap else 'not overlapped'}": fn(comm, overlap)
            for what, fn in (("DDP step", timeline_step), ("halo layer", timeline_layer)) for overlap in (True, False)}
    if comm.rank == 0:
        with open(path, "w", newline="") as fh:
            write_timeline(runs, identity()[0], fh)


if __name__ == "__main__":
    {"roofline": record_roofline, "timeline": record_timeline}[sys.argv[1]](sys.argv[2])
