"""What a notebook shows when a ``%%px`` cell fails or hangs (connect() installs it).

ipyparallel shows one traceback per rank, and "result not ready" for a hung cell. Here: one message per
distinct error with its ranks, the cell to fill in or that failed to bind a name, and for a hung or overdue
cell (``session.deadline``) why cells hang and ``session.restart()``.
"""
from __future__ import annotations

import _thread
import ast
import re
import sys
import threading

from ipyparallel.error import CompositeError

RESTART_HINT = ("The engines are still busy with it: run `session.restart()` (it replaces them in "
                "a few seconds), then run this section's cells again from its first %%px cell.")
DEADLOCK_HINT = ("Ranks that wait for each other forever are the usual cause: a Recv whose matching "
                 "Send never comes (every rank calling Recv before Send, or the wrong source/dest), "
                 "or a collective that not every rank calls.")


class State:
    rank_of: dict[int, int] = {}              # engine id -> MPI rank, of the session in use
    failed: list[tuple[int, set[str]]] = []   # (cell number, names it would have bound)
    deadline: float | None = None
    timer: threading.Timer | None = None
    expired = hinted = installed = False


def install(shell, rank_of: dict[int, int]) -> None:
    State.rank_of = dict(rank_of)
    if not State.installed:
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
            groups.setdefault((ename, evalue), []).append((info.get("engine_id"), lines))
        out = []
        for (ename, evalue), members in groups.items():
            stub = ename == "NotImplementedError"
            out += ([] if stub else members[0][1] or [f"{ename}: {evalue}"]) + [
                f"{ename} {_ranks([engine for engine, _ in members])}: {evalue}"]
            out += [_stub_hint(raw, members[0][1])] if stub else _name_hint(evalue) if ename == "NameError" else \
                ["The engines died: run `session.restart()` for new ones, then run this section's cells again from "
                 "its first %%px cell."] if ename == "EngineError" else []
        if _is_px(source):
            State.failed.append((number, _bound_names(source)))
        return shell._showtraceback(etype, value, out)
    if _is_px(source) and str(value) == "result not ready":  # %%px interrupted while the engines still run
        State.hinted = True
        why = f"ran past the deadline of {State.deadline:g} s" if State.expired else "was interrupted"
        return shell._showtraceback(etype, value, [f"This %%px cell {why} before the engines finished it.",
                                                   DEADLOCK_HINT, RESTART_HINT])
    shell.showtraceback((etype, value, tb), tb_offset=tb_offset)


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
    if State.deadline and _is_px(info.raw_cell):
        State.timer = threading.Timer(State.deadline, _expire)
        State.timer.daemon = True
        State.timer.start()


def _expire() -> None:
    State.expired = True
    _thread.interrupt_main()  # as the stop button does: %%px stops waiting and signals the engines


def _after_cell(result) -> None:
    if State.timer is not None:
        State.timer.cancel()
        State.timer = None
    if State.hinted or not _is_px(result.info.raw_cell):
        return
    from IPython import get_ipython

    last = getattr(get_ipython().magics_manager.registry.get("ParallelMagics"), "last_result", None)
    if State.expired:
        print(f"hpclab: this %%px cell ran past the deadline of {State.deadline:g} s and was interrupted. "
              f"{DEADLOCK_HINT} {RESTART_HINT}", file=sys.stderr)
    elif last is not None and not last.ready():
        print(f"hpclab: this %%px cell was interrupted but has not finished on the engines. {RESTART_HINT} "
              f"{DEADLOCK_HINT}", file=sys.stderr)
