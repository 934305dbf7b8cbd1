"""Render the notebooks as executed on a GPU into docs/rendered/, each HTML page stamped with its source.

    python docs/render.py                          # execute notebooks/ here (hpclab workbook), then render
    python docs/render.py --executed build/gpu     # render notebooks executed elsewhere by `hpclab workbook --out build/gpu`

Each page opens with the device, the date and the command that executed it, and carries in a
``<meta name="hpclab-source">`` tag the SHA-256 of its notebook's cell sources. tests/test_rendered.py
compares that hash with notebooks/ as they are now, so a page whose notebook has changed since it was
executed fails the tests until it is rendered again. Executing a notebook does not change its cell
sources, so an executed copy whose hash differs from notebooks/ is refused here too.
"""
from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import re
import subprocess
import sys
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parent.parent
META = re.compile(r'<meta name="hpclab-source" content="sha256:([0-9a-f]{64})"')
STYLE = re.compile(r"<style[^>]*>(.*?)</style>\n?", re.S)
CSS = "notebook.css"   # the template's stylesheets: the same ~7,000 lines on every page, kept once beside them
OVERWRITTEN = re.compile(r"[^\n]*\r(?=[^\n])")   # a line's text that a carriage return sends back over


def source_hash(nb) -> str:
    """SHA-256 of a notebook's cells: type and source, in order (outputs, ids and metadata aside)."""
    digest = hashlib.sha256()
    for cell in nb.cells:
        digest.update(f"{cell.cell_type}\0{cell.source}\0".encode())
    return digest.hexdigest()


def lesson_hash(name: str, notebooks: Path = ROOT / "notebooks") -> str:
    return source_hash(nbformat.read(notebooks / name, as_version=4))


def rendered_hash(html: Path) -> str | None:
    m = META.search(html.read_text(errors="replace"))
    return m.group(1) if m else None


def stale(rendered: Path, notebooks: Path = ROOT / "notebooks") -> list[str]:
    """Pages of ``rendered`` that do not come from the current notebooks, and notebooks without a page."""
    pages = {p.stem: p for p in rendered.glob("*.html")}
    problems = [f"{name}.html: notebooks/{name}.ipynb has changed since it was rendered"
                for name, page in sorted(pages.items())
                if not (notebooks / f"{name}.ipynb").exists() or rendered_hash(page) != lesson_hash(f"{name}.ipynb", notebooks)]
    return problems + [f"notebooks/{p.name} has no rendered page" for p in sorted(notebooks.glob("[0-9][0-9]_*.ipynb"))
                       if p.stem not in pages]


def shared_styles(html: str) -> tuple[str, str]:
    """(page, css): the stylesheets nbconvert inlines in ``<head>`` moved into one file the page links."""
    head, rest = html.split("</head>", 1)
    css = "\n".join(m.group(1).strip("\n") for m in STYLE.finditer(head)) + "\n"
    head = STYLE.sub("", head).replace("</title>", f'</title>\n<link rel="stylesheet" href="{CSS}">', 1)
    return f"{head}</head>{rest}", css


def as_jupyterlab_shows(outputs: list) -> list:
    """A cell's outputs with each run of one stream merged and carriage returns applied, as JupyterLab shows them.

    A progress bar (ipyparallel's %px, tqdm) redraws its line with "\\r" ten times a second: each redraw
    is a stream output of its own, and nbconvert would print every one. nbclient's ``coalesce_streams``
    merges all of a cell's stdout into its first, which would move text printed after a figure above it.
    """
    merged = []
    for out in outputs:
        if out.output_type == "stream" and merged and merged[-1].output_type == "stream" and merged[-1].name == out.name:
            merged[-1].text += out.text
        else:
            merged.append(out)
    for out in merged:
        if out.output_type == "stream":
            out.text = OVERWRITTEN.sub("", out.text)
    return merged


def execute(notebooks: Path, out: Path) -> dict:
    """Run `hpclab workbook` on ``notebooks`` into ``out``; what ran where, for the pages' banners."""
    # route 1 as a learner meets it: the notebook's own kernel without a GPU, the engines with them
    cmd = [sys.executable, "-m", "hpclab", "workbook", "--notebooks", str(notebooks), "--out", str(out), "--login-node"]
    probe = ("from hpclab import backend, device; kind = backend.select(); print(backend.describe(kind) if kind == 'sim' "
             "else f'{backend.count_gpus()}x {device.identity()[0]}, 4 MPI engines (the notebook kernel without a GPU, "
             "as on a login node)')")
    device = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout.strip()
    run = {"device": device, "date": datetime.date.today().isoformat(),
           "command": "python docs/render.py", "passed": subprocess.run(cmd).returncode == 0}
    (out / "run.json").write_text(json.dumps(run, indent=1) + "\n")
    return run


def render(executed: Path, out: Path, run: dict, notebooks: Path = ROOT / "notebooks") -> list[Path]:
    from nbconvert import HTMLExporter

    out.mkdir(parents=True, exist_ok=True)
    written = []
    for path in sorted(executed.glob("[0-9][0-9]_*.ipynb")):
        nb = nbformat.read(path, as_version=4)
        digest = source_hash(nb)
        if digest != lesson_hash(path.name, notebooks):
            raise SystemExit(f"{path} was executed from another version of notebooks/{path.name}: execute it again")
        banner = nbformat.v4.new_markdown_cell(
            f"*Executed on {run['device']}, {run['date']}, with `{run['command']}`, from `notebooks/{path.name}` "
            f"(cell sources sha256 `{digest[:12]}`). An expected output, not a result to copy.*")
        nb.cells.insert(0, banner)
        for cell in nb.cells:
            if cell.cell_type == "code":
                cell.outputs = as_jupyterlab_shows(cell.outputs)
        html, _ = HTMLExporter().from_notebook_node(nb)
        html = html.replace("<head>", f'<head>\n<meta name="hpclab-source" content="sha256:{digest}">', 1)
        html, css = shared_styles(html)
        (out / CSS).write_text(css)
        (out / f"{path.stem}.html").write_text(html)
        written.append(out / f"{path.stem}.html")
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--executed", type=Path, help="notebooks already executed by `hpclab workbook --out DIR`")
    parser.add_argument("--device", help="the device they ran on (default: DIR/run.json)")
    parser.add_argument("--date", help="the date they ran (default: DIR/run.json)")
    parser.add_argument("--notebooks", type=Path, default=ROOT / "notebooks")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "rendered")
    args = parser.parse_args(argv)
    if args.executed is None:
        args.executed = ROOT / "build" / "rendered"
        args.executed.mkdir(parents=True, exist_ok=True)
        run = execute(args.notebooks, args.executed)
        if not run["passed"]:
            print("some notebooks failed (see above); their pages show where", file=sys.stderr)
    else:
        saved = args.executed / "run.json"
        run = json.loads(saved.read_text()) if saved.exists() else {"command": f"python -m hpclab workbook --out {args.executed}"}
        run.update({k: v for k, v in (("device", args.device), ("date", args.date)) if v})
        if not {"device", "date"} <= run.keys():
            parser.error(f"{saved} is missing: give --device and --date")
    for page in render(args.executed, args.out, run, args.notebooks):
        print(f"wrote {page.relative_to(ROOT) if page.is_relative_to(ROOT) else page}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
