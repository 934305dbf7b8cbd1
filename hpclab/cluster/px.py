"""What a notebook shows when a ``%%px`` cell fails or hangs (connect() installs it).

ipyparallel shows one traceback per rank, and "result not ready" for a hung cell. Here: one message per
distinct error with its ranks, the cell to fill in or that failed to bind a name, and for a hung or overdue
cell (``session.deadline``) why cells hang and ``session.restart()``. Where the engines are a Slurm job, a
watcher asks Slurm about it while a ``%%px`` cell runs: when the job ends (scancel, its time limit, a lost
node), the cell stops within seconds with one message naming the job, its state and what to do, instead of
one traceback per engine once ipyparallel notices the engines are gone.
"""
from __future__ import annotations

import _thread
import ast
import re
import sys
import threading
import time

from ipyparallel import Client
from ipyparallel.error import CompositeError

RESTART_HINT = ("The engines are still busy with it: run `session.restart()` (it replaces them in "
                "a few seconds), then run this section's cells again from its first %%px cell.")
DEADLOCK_HINT = ("Ranks that wait for each other forever are the usual cause: a Recv whose matching "
                 "Send never comes (every rank calling Recv before Send, or the wrong source/dest), "
                 "or a collective that not every rank calls.")


JOB_POLL_S = 3        # how often the watcher asks Slurm while a %%px cell runs
JOB_VERDICT_S = 20    # how long to wait, once the engines are gone, for Slurm to say why


class State:
    rank_of: dict[int, int] = {}              # engine id -> MPI rank, of the session in use
    failed: list[tuple[int, set[str]]] = []   # (cell number, names it would have bound)
    deadline: float | None = None
    timer: threading.Timer | None = None
    job: str | None = None                    # the engines' Slurm job, if they are one
    watcher: threading.Thread | None = None
    running = threading.Event()               # set while a %%px cell runs
    job_ended: str | None = None              # Slurm's verdict on the job, once it ended during a cell
    expired = hinted = installed = False


def install(shell, rank_of: dict[int, int], job: str | None = None) -> None:
    State.rank_of, State.job = dict(rank_of), job
    if not State.installed:
        Client.send_signal = _unless_job_ended(Client.send_signal)
        shell.set_custom_exc((CompositeError, TimeoutError), _show_error)
        shell.events.register("pre_run_cell", _before_cell)
        shell.events.register("post_run_cell", _after_cell)
        State.installed = True


def _is_px(source: str) -> bool:
    return (source or "").lstrip().startswith("%%px")


def _ranks(engine_ids: list[int]) -> str:
    ranks = sorted(State.rank_of.get(e, e) for e in engine_ids)
    if len(ranks) == len(State.rank_of) > 1:
        return f"on all {len(ranks)} ranks"
    return f"on rank{'s' * (len(ranks) > 1)} {', '.join(map(str, ranks))}"


def _show_error(shell, etype, value, tb, tb_offset=None):
    """IPython's custom exception handler, for %%px cells."""
    raw = shell.history_manager.input_hist_raw
    number, source = len(raw) - 1, (raw[-1] if raw else "")
    if isinstance(value, CompositeError):
        groups: dict[tuple[str, str], list] = {}
        for ename, evalue, traceback, info in value.elist:
            lines = traceback.splitlines() if isinstance(traceback, str) else (traceback or [])
            engine = info.get("engine_id")
            if ename == "EngineError":          # "Engine 3 died while running task ...": one group for all
                found = re.search(r"Engine (\d+) died", evalue or "")
                engine, evalue = int(found.group(1)) if found else engine, "the engine died while running this cell"
            groups.setdefault((ename, evalue), []).append((engine, lines))
        out = []
        for (ename, evalue), members in groups.items():
            stub = ename == "NotImplementedError"
            if ename == "EngineError":
                out += [f"The engines {_ranks([engine for engine, _ in members]).replace('on ', 'of ', 1)} died while "
                        "running this cell.",
                        _why_engines_died()]
                continue
            out += ([] if stub else members[0][1] or [f"{ename}: {evalue}"]) + [
                f"{ename} {_ranks([engine for engine, _ in members])}: {evalue}"]
            out += [_stub_hint(raw, members[0][1])] if stub else _name_hint(evalue) if ename == "NameError" else []
        if _is_px(source):
            State.failed.append((number, _bound_names(source)))
        return shell._showtraceback(etype, value, out)
    if _is_px(source) and str(value) == "result not ready":  # %%px interrupted while the engines still run
        State.hinted = True
        return shell._showtraceback(etype, value, _interrupted())
    shell.showtraceback((etype, value, tb), tb_offset=tb_offset)


def _interrupted() -> list[str]:
    """Why a %%px cell stopped before the engines finished it (their Slurm job ended, its deadline, the stop
    button), and what to do."""
    if State.job_ended:   # the watcher stopped the cell
        return [f"The engines' {State.job_ended}", JOB_ENDED_HINT]
    why = f"ran past the deadline of {State.deadline:g} s" if State.expired else "was interrupted"
    return [f"This %%px cell {why} before the engines finished it.", DEADLOCK_HINT, RESTART_HINT]


JOB_ENDED_HINT = ("Run `session.restart()`: it submits a new engines job (it may queue), then run this section's "
                  "cells again from its first %%px cell. Your notebooks and my-work/ are untouched.")


def _why_engines_died() -> str:
    """What ended the engines: Slurm's verdict on their job (waited for a little: Slurm notices a lost node
    later than ipyparallel notices its engines gone), else the way out."""
    if State.job is None:
        return "Run `session.restart()` for new ones, then run this section's cells again from its first %%px cell."
    from hpclab.cluster import jobs

    end = time.monotonic() + JOB_VERDICT_S
    while State.job_ended is None and jobs.active(State.job) and time.monotonic() < end:
        time.sleep(1)
    verdict = State.job_ended or (jobs.diagnose(State.job) if not jobs.active(State.job) else
                                  f"Slurm job {State.job} still says it runs, but its engines stopped answering: "
                                  "their node may be lost (Slurm marks it NODE_FAIL once it gives up on it).")
    return f"{verdict} {JOB_ENDED_HINT}"


def _unless_job_ended(send_signal):
    """%%px signals the engines when its cell is interrupted and waits for their replies: after their job has
    ended nobody replies, so the cell ends here instead, with Slurm's verdict."""
    def wrapper(*args, **kwargs):
        if State.job_ended and State.running.is_set():
            raise TimeoutError("result not ready")
        return send_signal(*args, **kwargs)
    return wrapper


def _watch_job() -> None:
    """While %%px cells run: if the engines' Slurm job ends, say why and stop the cell (as the stop button does)."""
    from hpclab.cluster import jobs

    while State.job is not None:
        State.running.wait()
        found = jobs.info(State.job) if State.job else None
        if found is not None and not found.active and State.running.is_set() and State.job_ended is None:
            State.job_ended = jobs.diagnose(found.job_id)
            if State.running.is_set():      # (the cell may have ended meanwhile)
                _thread.interrupt_main()
        time.sleep(JOB_POLL_S)


def _stub_hint(raw: list[str], traceback: list[str]) -> str:
    """Where the unfilled stub is: the earlier cell that defines the function that raised."""
    frames = re.findall(r", in (\w+)\(", re.sub(r"\x1b\[[0-9;]*m", "", "\n".join(traceback)))
    for cell in range(len(raw) - 2, 0, -1) if frames else ():
        if re.search(rf"^\s*def {frames[-1]}\(", raw[cell], re.M) and "NotImplementedError" in raw[cell]:
            return (f"Fill in the part marked `raise NotImplementedError` in cell [{cell}] (where `{frames[-1]}` is "
                    "defined), run that cell, then this one.")
    return "Fill in the part marked `raise NotImplementedError` in this cell, then run it again."


def _name_hint(evalue: str) -> list[str]:
    match = re.search(r"name '(\w+)' is not defined", evalue)
    for number, names in reversed(State.failed if match else []):
        if match.group(1) in names:
            return [f"`{match.group(1)}` would have been defined by cell [{number}], which failed: fix that cell "
                    "and run it again, then this one."]
    return []


def _bound_names(source: str) -> set[str]:
    """Names a %%px cell binds at its top level (assignments, defs, imports, loops)."""
    try:
        todo, names = [ast.parse(source.partition("\n")[2])], set()
    except SyntaxError:
        return set()
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)  # what a function binds inside is its own
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif not isinstance(node, ast.Lambda):
            todo.extend(ast.iter_child_nodes(node))
    return names


def _before_cell(info) -> None:
    State.hinted = State.expired = False
    State.job_ended = None
    if State.job and _is_px(info.raw_cell):
        State.running.set()
        if State.watcher is None or not State.watcher.is_alive():
            State.watcher = threading.Thread(target=_watch_job, name="hpclab-slurm-watch", daemon=True)
            State.watcher.start()
    if State.deadline and _is_px(info.raw_cell):
        State.timer = threading.Timer(State.deadline, _expire)
        State.timer.daemon = True
        State.timer.start()


def _expire() -> None:
    State.expired = True
    _thread.interrupt_main()  # as the stop button does: %%px stops waiting and signals the engines


def _after_cell(result) -> None:
    State.running.clear()
    if State.timer is not None:
        State.timer.cancel()
        State.timer = None
    if State.hinted or not _is_px(result.info.raw_cell):
        return
    from IPython import get_ipython

    last = getattr(get_ipython().magics_manager.registry.get("ParallelMagics"), "last_result", None)
    if State.job_ended or State.expired or (last is not None and not last.ready()):
        print("hpclab: " + " ".join(_interrupted()), file=sys.stderr)
