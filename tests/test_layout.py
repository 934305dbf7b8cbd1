"""The library's shape (README, "Layout"): a shared core that knows no topic, topic packages
on top of it, and no module reaching into another's private names."""
import ast

from .helpers import ROOT

TOPICS = ("collectives", "pi", "matmul", "comm", "halo", "ddp")
DISPATCH = {"cli.py", "__main__.py", "topics.py"}   # the command line: above every topic


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


def test_the_core_and_cluster_import_no_topic():
    wrong = []
    for path in _modules():
        inside = path.relative_to(ROOT / "hpclab").parts
        if (len(inside) == 1 and inside[0] not in DISPATCH) or inside[0] == "cluster":
            wrong += [f"{'/'.join(inside)}: {module} {names}" for module, names in _imports(path)
                      if set(module.split(".")[1:2] if "." in module else names) & set(TOPICS)]
    assert len(_modules()) > 50 and not wrong, wrong


def test_no_private_name_is_imported_from_another_module():
    wrong = [f"{path.relative_to(ROOT)}: from {module} import {name}" for path in _modules()
             for module, names in _imports(path) for name in names
             if name.startswith("_") and not name.startswith("__")]
    assert not wrong, wrong
