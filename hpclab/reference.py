"""Published timings to compare with: the FASRC workshop's A100 runs (``data/fasrc_a100.csv``).

Source: the Harvard FASRC "Distributed GPU Computing" workshop, fasrc/User_Codes,
Training/Distributed_GPU_Computing (each row's ``source`` column names the file; ``date``
is the day the output holding the timing was committed there, as the runs carry no date).
"""
from __future__ import annotations

import csv
import io
from importlib import resources

SOURCE = ("FASRC workshop 'Distributed GPU Computing' (github.com/fasrc/User_Codes, "
          "Training/Distributed_GPU_Computing), A100 runs")


def fasrc_a100(exercise: str | None = None) -> list[dict]:
    """The table's rows (numbers converted), optionally only one exercise, e.g. ``ex2_pi_mc``."""
    text = resources.files("hpclab").joinpath("data/fasrc_a100.csv").read_text()
    rows = []
    for row in csv.DictReader(io.StringIO(text)):
        if exercise and row["exercise"] != exercise:
            continue
        row["gpus"], row["nodes"], row["work"] = int(row["gpus"]), int(row["nodes"]), int(row["work"])
        row["wall_s"] = float(row["wall_s"]) if row["wall_s"] else None
        rows.append(row)
    return rows


def a100_scaling(exercise: str = "ex2_pi_mc") -> list[dict]:
    """The workshop's strong-scaling runs as summary rows (ranks, work, median_wall_s, speedup, efficiency)."""
    rows = sorted((r for r in fasrc_a100(exercise) if r["wall_s"]), key=lambda r: r["gpus"])
    if not rows:
        raise ValueError(f"no timed A100 rows for {exercise!r}; exercises: "
                         f"{sorted({r['exercise'] for r in fasrc_a100()})}")
    base = rows[0]["wall_s"] * rows[0]["gpus"]
    return [{"ranks": r["gpus"], "work": r["work"], "median_wall_s": r["wall_s"], "speedup": base / r["wall_s"],
             "efficiency": base / r["wall_s"] / r["gpus"], "source": r["source"]} for r in rows]


def cite(rows: list[dict]) -> str:
    """One line naming where the rows come from."""
    sources = sorted({r["source"].split(" (")[0] for r in rows})
    return f"{SOURCE}: {'; '.join(sources)}"
