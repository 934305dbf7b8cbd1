"""The library's shape (docs/architecture.md): layers that import only downwards, no module reaching into
another's private names, no import cycles, and one home for each concept the others call.

The layers, bottom up: the shared runtime (the root modules, ``results/``, ``cluster/``), the harness that runs
programs (``runner``, ``scaling``), the topic packages in ``TOPIC_ORDER`` (each may use those before it: ``comm``
the pi kernels for Exercises 3 and 4, the others ``comm``'s backends, ``halo`` and ``ddp`` the matmul kernels), and on top
the command line with the registry of program names."""
import ast
import re

from .helpers import ROOT

RUNTIME_PACKAGES = {"cluster", "results", "cli", "data"}
TOPICS = tuple(sorted(p.name for p in (ROOT / "hpclab").iterdir()
                      if (p / "__init__.py").is_file() and p.name not in RUNTIME_PACKAGES))
TOPIC_ORDER = ("pi", "comm", "matmul", "collectives", "halo", "ddp", "beyond")
HARNESS = {"runner", "scaling"}
DISPATCH = {"cli", "programs", "__main__"}


def _imports(path) -> list[tuple[str, list[str]]]:
    """(module, names) of every hpclab import in a file, function-level ones too."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("hpclab"):
            found.append((node.module, [a.name for a in node.names]))
        elif isinstance(node, ast.Import):
            found += [(a.name, []) for a in node.names if a.name.startswith("hpclab")]
    return found


def _modules():
    return sorted((ROOT / "hpclab").rglob("*.py"))


def test_no_private_name_is_imported_from_another_module():
    wrong = [f"{path.relative_to(ROOT)}: from {module} import {name}" for path in _modules()
             for module, names in _imports(path) for name in names
             if name.startswith("_") and not name.startswith("__")]
    assert not wrong, wrong


def _graph() -> dict[str, set[str]]:
    """hpclab's static import graph: module -> the hpclab modules it imports, at module level or inside functions."""
    mods = {".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__"): p for p in _modules()}

    def resolve(name):      # `from hpclab.comm import get` imports hpclab.comm; `from hpclab.pi import mc`, hpclab.pi.mc
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name

    graph = {}
    for module, path in mods.items():
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        found = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found |= {resolve(a.name) for a in node.names}
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = ".".join(package.split(".")[:len(package.split(".")) - node.level + 1] + [base]).strip(".")
                found |= {resolve(f"{base}.{a.name}") for a in node.names}
        graph[module] = {m for m in found if m and m not in ("hpclab", module)}
    return graph


def _cycle(graph) -> list[str]:
    """One cycle of the graph (empty when there is none), by depth-first search."""
    state, path = {}, []

    def visit(v):
        state[v] = "open"
        path.append(v)
        for w in sorted(graph.get(v, ())):
            if state.get(w) == "open":
                return path[path.index(w):] + [w]
            if w not in state and (found := visit(w)):
                return found
        state[v] = "done"
        path.pop()
        return []

    for v in sorted(graph):
        if v not in state and (found := visit(v)):
            return found
    return []


def _layer(module: str) -> int:
    part = module.split(".")[1]
    if part in DISPATCH:
        return 100
    if part in TOPICS:
        return 2 + TOPIC_ORDER.index(part)
    return 1 if part in HARNESS else 0


def test_no_import_runs_back_up_the_layers():
    assert set(TOPICS) <= set(TOPIC_ORDER), f"place the new topic package in TOPIC_ORDER: {set(TOPICS) - set(TOPIC_ORDER)}"
    graph = _graph()
    up = [f"{m} ({_layer(m)}) imports {d} ({_layer(d)})" for m, deps in graph.items() for d in deps
          if _layer(d) > _layer(m)]
    assert len(graph) > 50 and not up, up
    assert _layer("hpclab.results.recorded") < _layer("hpclab.scaling") < _layer("hpclab.pi.run_mc") \
        < _layer("hpclab.ddp.trainer") < _layer("hpclab.programs")


def test_the_import_graph_has_no_cycles():
    graph = _graph()
    assert len(graph) > 50 and "hpclab.pi.philox" in graph["hpclab.pi.check"], sorted(graph)[:5]
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]     # the search finds one
    assert not _cycle(graph), " -> ".join(_cycle(graph))


def _sources():
    return [p for p in _modules() + sorted((ROOT / "benchmarks").glob("*.py"))]


def test_each_concept_is_defined_once():
    """The timed region, speedup and efficiency, the facts about each program, the input check, the
    recorded table's reader, the memory check and the GPU's name each have one home, which the others call."""
    from hpclab.programs import PROGRAMS

    homes = {"timing.py": [], "speedup.py": [], "programs.py": [], "runner.py": [], "recorded.py": [], "budget.py": [],
             "device.py": []}
    for path in _sources():
        text, name = path.read_text(), path.name
        tree = ast.parse(text)
        # barrier, then a clock: the timed region of timing.wall
        if re.search(r"\.Barrier\(\)\s*\n\s*\w+\s*=\s*(MPI\.Wtime|time\.perf_counter)\(\)", text):
            homes["timing.py"].append(name)
        # speedup or efficiency defined, or computed by division, anywhere but hpclab.speedup.speedups
        if any(isinstance(f, ast.FunctionDef) and re.search(r"speedup|efficienc", f.name) for f in ast.walk(tree)) \
                and not re.search(r"from hpclab\.(speedup|scaling) import .*\bspeedups\b", text):
            homes["speedup.py"].append(name)
        for node in ast.walk(tree):
            pairs = [(t.id, node.value) for t in node.targets if isinstance(t, ast.Name)] \
                if isinstance(node, ast.Assign) else []
            if any(re.search(r"speedup|^eff", target) and any(isinstance(n, ast.BinOp) and isinstance(n.op, ast.Div)
                                                            for n in ast.walk(value)) for target, value in pairs):
                homes["speedup.py"].append(name)
        # a table keyed by program names: the registry's job
        for node in ast.walk(tree):
            if isinstance(node, ast.Dict) and len({k.value for k in node.keys if isinstance(k, ast.Constant)}
                                                  & set(PROGRAMS)) >= 2:
                homes["programs.py"].append(name)
        if re.search(r"\.validate\(args|module\.validate\(", text):
            homes["runner.py"].append(name)
        if "recorded.csv\")" in text.replace("'", '"') or "recorded.csv\").read" in text:
            homes["recorded.py"].append(name)
        if "/proc/meminfo" in text or "virtual_memory(" in text:
            homes["budget.py"].append(name)
        if ".name.decode(" in text:             # the GPU's name, as Numba gives it (bytes or str)
            homes["device.py"].append(name)
    assert {home: sorted(set(names)) for home, names in homes.items()} == \
        {home: [home] for home in homes}, homes
