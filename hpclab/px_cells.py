"""What a notebook shows when a ``%%px`` cell fails or hangs (installed by ``hpclab.cluster``).

* The same exception on several ranks arrives as one ipyparallel ``CompositeError``
  with one traceback per rank. It is shown once, with the ranks it happened on
  ("NotImplementedError on all 4 ranks: ..."); for an unfilled exercise stub, with
  the cell to fill in.
* A ``NameError`` for a name that an earlier failed ``%%px`` cell would have defined
  says which cell to fix.
* A ``%%px`` cell that is interrupted (the stop button, or ``session.deadline``)
  while its engines still run says how to get going again: ``session.restart()``.
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

_ANSI = re.compile(r"\x1b\[[0-9;]*m")


class _State:
    rank_of: dict[int, int] = {}   # engine id -> MPI rank, of the session in use
    failed: list[tuple[int, set[str]]] = []   # (cell number, names it would define)
    deadline: float | None = None
    timer: threading.Timer | None = None
    expired = False
    hinted = False
    installed = False


def install(shell, rank_of: dict[int, int]) -> None:
    """Use these displays in ``shell`` for the engines mapped by ``rank_of``."""
    _State.rank_of = dict(rank_of)
    if _State.installed:
        return
    shell.set_custom_exc((CompositeError, TimeoutError), _show_error)
    shell.events.register("pre_run_cell", _before_cell)
    shell.events.register("post_run_cell", _after_cell)
    _State.installed = True


def set_deadline(seconds: float | None) -> None:
    _State.deadline = seconds


# --- errors ------------------------------------------------------------------------------------

def _ranks(engine_ids: list[int]) -> str:
    ranks = sorted(_State.rank_of.get(e, e) for e in engine_ids)
    if len(ranks) == len(_State.rank_of) and len(ranks) > 1:
        return f"on all {len(ranks)} ranks"
    return f"on rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))}"


def _show_error(shell, etype, value, tb, tb_offset=None):
    """IPython custom exception handler for %%px cells."""
    number, source = _current_cell(shell)
    if isinstance(value, CompositeError):
        return _show_composite(shell, etype, value, number, source)
    if source.lstrip().startswith("%%px") and str(value) == "result not ready":
        # ipyparallel's %%px, interrupted while the engines still run, fails to show their output
        _State.hinted = True
        why = f"ran past the deadline of {_State.deadline:g} s" if _State.expired else "was interrupted"
        return shell._showtraceback(etype, value, [
            f"This %%px cell {why} before the engines finished it.", DEADLOCK_HINT, RESTART_HINT])
    shell.showtraceback((etype, value, tb), tb_offset=tb_offset)


def _show_composite(shell, etype, value, number: int, source: str):
    """One message per distinct error, with the ranks it happened on, not one per rank."""
    groups: dict[tuple[str, str], list] = {}
    for ename, evalue, traceback, info in value.elist:
        if isinstance(traceback, str):
            traceback = traceback.splitlines()
        groups.setdefault((ename, evalue), []).append((info.get("engine_id"), traceback or []))
    lines = []
    for (ename, evalue), members in groups.items():
        where = _ranks([engine for engine, _ in members])
        if ename == "NotImplementedError":
            lines.append(f"{ename} {where}: {evalue}")
            lines.append(_stub_hint(shell, members[0][1]))
            continue
        lines.extend(members[0][1] or [f"{ename}: {evalue}"])
        lines.append(f"{ename} {where}: {evalue}")
        if ename == "NameError":
            lines.extend(_name_hint(evalue))
        elif ename == "EngineError":
            lines.append("The engines died: run `session.restart()` for new ones, then run this "
                         "section's cells again from its first %%px cell.")
    if source.lstrip().startswith("%%px"):
        _State.failed.append((number, _defined_names(source)))
    shell._showtraceback(etype, value, lines)


def _current_cell(shell) -> tuple[int, str]:
    raw = shell.history_manager.input_hist_raw
    return len(raw) - 1, (raw[-1] if raw else "")


def _stub_hint(shell, traceback: list[str]) -> str:
    """Where the unfilled stub is: the cell that defines the function that raised, if earlier."""
    frames = re.findall(r", in (\w+)\(", _ANSI.sub("", "\n".join(traceback)))
    function = frames[-1] if frames else None
    raw = shell.history_manager.input_hist_raw
    if function:
        for cell in range(len(raw) - 2, 0, -1):
            if re.search(rf"^\s*def {function}\(", raw[cell], re.M) and "NotImplementedError" in raw[cell]:
                return (f"Fill in the part marked `raise NotImplementedError` in cell [{cell}] (where "
                        f"`{function}` is defined), run that cell, then this one.")
    return "Fill in the part marked `raise NotImplementedError` in this cell, then run it again."


def _name_hint(evalue: str) -> list[str]:
    match = re.search(r"name '(\w+)' is not defined", evalue)
    if not match:
        return []
    for number, names in reversed(_State.failed):
        if match.group(1) in names:
            return [f"`{match.group(1)}` would have been defined by cell [{number}], which failed: "
                    "fix that cell and run it again, then this one."]
    return []


def _defined_names(source: str) -> set[str]:
    """Names a %%px cell binds at its top level (assignments, defs, imports, loops)."""
    body = source.split("\n", 1)[1] if "\n" in source else ""
    try:
        tree = ast.parse(body)
    except SyntaxError:
        return set()
    names: set[str] = set()

    def visit(node):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
            return  # what a function binds inside is its own
        if isinstance(node, ast.Lambda):
            return
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return names


# --- interrupted and overdue cells ---------------------------------------------------------------

def _before_cell(info) -> None:
    _State.hinted = _State.expired = False
    if _State.deadline and (info.raw_cell or "").lstrip().startswith("%%px"):
        _State.timer = threading.Timer(_State.deadline, _expire)
        _State.timer.daemon = True
        _State.timer.start()


def _expire() -> None:
    _State.expired = True
    _thread.interrupt_main()  # as the stop button does: %%px stops waiting and signals the engines


def _after_cell(result) -> None:
    if _State.timer is not None:
        _State.timer.cancel()
        _State.timer = None
    if _State.hinted or not (result.info.raw_cell or "").lstrip().startswith("%%px"):
        return
    if _State.expired:
        print(f"hpclab: this %%px cell ran past the deadline of {_State.deadline:g} s and was "
              f"interrupted. {DEADLOCK_HINT} {RESTART_HINT}", file=sys.stderr)
        return
    magics = _px_magics()
    last = getattr(magics, "last_result", None)
    if last is not None and not last.ready():
        print(f"hpclab: this %%px cell was interrupted but has not finished on the engines. "
              f"{RESTART_HINT} {DEADLOCK_HINT}", file=sys.stderr)


def _px_magics():
    from IPython import get_ipython

    shell = get_ipython()
    return shell.magics_manager.registry.get("ParallelMagics") if shell is not None else None
