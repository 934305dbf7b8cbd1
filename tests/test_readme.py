"""The README is the front door: short, its first screen names the three cluster routes (and the laptop's)
with their first commands, and every relative link in it, and in the pages it sends readers to, leads
somewhere that exists (a file, a folder, or a heading of a markdown file)."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
PAGES = [README, *(ROOT / "docs" / f"{name}.md" for name in ("cluster", "results", "testing", "architecture")),
         ROOT / "benchmarks" / "HISTORY.md"]
FIRST_SCREEN = 59          # lines: what a reader sees before scrolling far
# Each route's first commands, in the README's first screen.
ROUTES = {
    "route 1: JupyterLab on the login node, engines in one Slurm job per learner":
        ["make setup GPU_STACK=cu12", "hpclab cluster init --slurm --partition P --gpus-per-node G", "make lab"],
    "route 2: JupyterLab inside an allocation": ["salloc", "make lab"],
    "route 3: batch jobs": ["sbatch slurm/ex2_pi_mc.sbatch"],
    "a laptop or CI box (the simulator)": ["make run", "make lab"],
}
# What holds no link: fenced and inline code, HTML comments (the result tables' templates).
NOT_TEXT = re.compile(r"```.*?```|`[^`\n]*`|<!--.*?-->", re.S)
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$", re.M)


def slug(heading: str) -> str:
    """A heading's anchor as GitHub makes it: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    found = set()
    for heading in HEADING.findall(re.sub(r"```.*?```", "", path.read_text(), flags=re.S)):
        base = slug(heading)
        found.add(base if base not in seen else f"{base}-{seen[base]}")
        seen[base] = seen.get(base, 0) + 1
    return found


def broken_links(path: Path, root: Path = ROOT) -> list[str]:
    text = NOT_TEXT.sub("", path.read_text())
    wrong = []
    for target in LINK.findall(text):
        if re.match(r"[a-z][a-z0-9+.-]*:", target, re.I):         # https:, mailto: ...: not a relative link
            continue
        file, _, anchor = target.partition("#")
        where = (path.parent / file).resolve() if file else path
        if not where.exists():
            wrong.append(f"{target}: no {where.relative_to(root) if where.is_relative_to(root) else where}")
        elif anchor and where.suffix == ".md" and anchor not in anchors(where):
            wrong.append(f"{target}: {where.relative_to(root)} has no heading #{anchor}")
    return wrong


def test_the_readme_is_at_most_200_lines():
    lines = README.read_text().splitlines()
    assert len(lines) <= 200, f"README.md has {len(lines)} lines; the detail belongs in docs/"


@pytest.mark.parametrize("path", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(path):
    assert path.exists(), path
    assert broken_links(path) == []


def test_the_routes_first_commands_are_on_the_first_screen():
    first = "\n".join(README.read_text().splitlines()[:FIRST_SCREEN])
    missing = {route: [c for c in commands if c not in first] for route, commands in ROUTES.items()}
    assert not any(missing.values()), f"not in README.md's first {FIRST_SCREEN} lines: {missing}"
    where = [first.find(f"Route {n}") for n in (1, 2, 3)]
    assert 0 <= where[0] < where[1] < where[2], where


def test_the_link_checker_catches_a_broken_link_and_anchor(tmp_path):
    (tmp_path / "a.md").write_text("# A page\n\n## Route 1 — JupyterLab, one job\n\n[ok](#route-1--jupyterlab-one-job) "
                                   "[file](b.md#top) [gone](c.md) [web](https://example.org) `[code](d.md)`\n")
    (tmp_path / "b.md").write_text("# Other\n")
    wrong = [w.split(":")[0] for w in broken_links(tmp_path / "a.md", tmp_path)]
    assert wrong == ["b.md#top", "c.md"]
