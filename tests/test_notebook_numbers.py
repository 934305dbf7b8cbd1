"""Every figure a notebook's text states is backed, in one of three ways a reader can follow.

A *figure* is a number in a markdown cell's prose that states a quantity: one with a decimal
point, an exponent (2.07e12, 10¹¹, 6 × 10⁻⁸) or thousands separators (10,000), one followed by a
unit (%, ×, s, ms, µs, GB/s, TFLOP/s, MiB, M, ...), or any whole number from 100 up, except
years and sizes (a power of two, alone or in bytes: 4096, 32,768, 256 MiB). Small counts (4 ranks, Exercise 2, a 6 → 4 → 2 MLP), numbers inside `code`, inside
$math$ (a derivation shown to the reader) and in identifiers (H200, C1) are not figures.

Right after each figure (after its unit or the one word that follows it, and any closing ** or *), an HTML
comment, invisible when
rendered, says where it comes from:

    0.923 ms<!-- recorded: allreduce/nccl/h200x2/2gpu/268435456/time_s -->   a row of the recorded table
    0.150 ms<!-- source: fasrc-slides -->                                    a source listed in docs/sources.md
    8,388,608<!-- derived: 256**3 / 2 -->                                     arithmetic, checked here

A range (157–220 µs) takes one comment after its second number. tests/test_recorded.py checks a
recorded figure against the table; this file checks that every figure has a comment, that a
source is listed in docs/sources.md, and that a derived figure equals its expression as quoted
(to the digits shown).
"""
from __future__ import annotations

import math
import re
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb")) + sorted((ROOT / "solutions").glob("*.ipynb"))
SOURCES = ROOT / "docs" / "sources.md"

MARKER = re.compile(r"<!--\s*(recorded|source|derived):\s*(.*?)\s*-->")
# Text that holds no figures: fenced and inline code, display and inline math, link targets, other comments.
EXEMPT = re.compile(r"```.*?```|`[^`\n]*`|\$\$.*?\$\$|\$[^$]+?\$|\]\([^)\s]*\)|<!--(?!\s*(?:recorded|source|derived):).*?-->",
                    re.S)
SUPER = str.maketrans("⁰¹²³⁴⁵⁶⁷⁸⁹⁻", "0123456789-")
NUMBER = re.compile(
    r"(?<![\w.\-/^])"
    r"(?P<int>\d{1,3}(?:[,\u2009\u202f\u00a0 ]\d{3})+(?![\d.])|\d+)(?P<frac>\.\d+)?"
    r"(?:(?P<e>[eE][-+]?\d+)|\s?[×·]\s?10(?P<pow10>[⁻⁰¹²³⁴⁵⁶⁷⁸⁹]+)|(?P<sup>[⁻⁰¹²³⁴⁵⁶⁷⁸⁹]+))?"
    r"(?![\w.]*\.\d)(?!\w)")
UNIT = re.compile(r"\s?(?:%|×(?!\s*[\dA-Z*(])|µs\b|us\b|ms\b|ns\b|s\b|[TGM]FLOP(?:/s)?|[kMG]B/s|[KMGT]i?B\b|"
                  r"B\b|M\b|bytes\b|samples/s|bins/s)")
SIZE_UNITS = {"", "B", "KiB", "MiB", "GiB", "bytes"}
RANGE = re.compile(r"\s?[–-]\s?$")
TRAIL = re.compile(r"(?:\s[^\W\d_]+(?:/[^\W\d_]+)?)?[*_]*")    # one word after the number: its noun (10,000 bins)


def figure_value(m: re.Match) -> float:
    mantissa = float(re.sub(r"[,\u2009\u202f\u00a0 ]", "", m["int"]) + (m["frac"] or "") + (m["e"] or ""))
    if m["pow10"]:
        mantissa *= 10.0 ** int(m["pow10"].translate(SUPER))
    if m["sup"]:
        mantissa **= int(m["sup"].translate(SUPER))
    return mantissa


def is_figure(m: re.Match, unit: str) -> bool:
    if unit or m["frac"] or m["e"] or m["pow10"] or m["sup"] or not m["int"].isdigit():
        return True
    n = int(m["int"])
    return n >= 100 and not 1950 <= n <= 2030          # a year is not a figure


def is_size(m: re.Match, unit: str) -> bool:
    """A power of two without a decimal, alone or in bytes, is a size chosen (4096, 256 MiB), not a figure."""
    n = figure_value(m)
    return (unit.strip() in SIZE_UNITS and not (m["frac"] or m["e"] or m["pow10"] or m["sup"])
            and (n >= 2 or unit.strip() in {"KiB", "MiB", "GiB"}) and n == int(n) and int(n) & (int(n) - 1) == 0)


def resolution(m: re.Match) -> float:
    """Half a unit of the last digit quoted: how far a derived value may be from the figure."""
    decimals = len(m["frac"] or ".") - 1
    exponent = int(m["e"][1:]) if m["e"] else int(m["pow10"].translate(SUPER)) if m["pow10"] else 0
    if m["sup"]:          # 10⁻¹⁶ states an order of magnitude; 2¹⁶ a value
        return figure_value(m) * (10 ** 0.5 - 1 if m["int"] == "10" else 1e-9)
    return 0.5 * 10.0 ** (exponent - decimals)


def derived_value(expr: str):
    names = {k: getattr(math, k) for k in ("sqrt", "log", "log2", "log10", "exp", "pi", "ceil", "floor")}
    return eval(expr, {"__builtins__": {"min": min, "max": max, "round": round, "sum": sum, "abs": abs}}, names)


def blank(text: str) -> str:
    """The text with exempt parts replaced by spaces (positions kept)."""
    return EXEMPT.sub(lambda m: " " * len(m.group(0)), text)


def sources() -> set[str]:
    return set(re.findall(r"^\|\s*`([\w.-]+)`\s*\|", SOURCES.read_text(), re.M))


def problems(markdown: str, known_sources: set[str] | None = None) -> list[str]:
    """What is wrong with the figures of one markdown cell: unbacked figures, unknown sources,
    derivations that do not give the figure, markers that follow no number."""
    known = sources() if known_sources is None else known_sources
    text = blank(markdown)
    prose = MARKER.sub(lambda m: " " * len(m.group(0)), text)      # the numbers of the expressions aside
    tokens = []                                    # (match, unit, marker right after it or None)
    for m in NUMBER.finditer(prose):
        unit_m = UNIT.match(text, m.end())
        unit = unit_m.group(0) if unit_m else ""
        end = m.end() + len(unit)
        end += len(TRAIL.match(text, end).group(0))
        tokens.append((m, unit, MARKER.match(text, end)))
    out, used, i = [], set(), 0
    while i < len(tokens):
        m, unit, marker = tokens[i]
        first = m
        if marker is None and i + 1 < len(tokens) and RANGE.search(text[m.end():tokens[i + 1][0].start()]):
            i += 1                                 # "A–B unit": one figure, backed after B
            m, unit, marker = tokens[i]
        i += 1
        figure = text[first.start():m.end()] + unit.rstrip()
        if marker is None:
            if any(is_figure(t, unit) and not is_size(t, unit) for t in (first, m)):
                out.append(f"{figure!r} is a figure without a source: add <!-- recorded: KEY -->, "
                           "<!-- source: ID --> or <!-- derived: EXPRESSION --> right after it")
            continue
        used.add(marker.start())
        kind, arg = marker.group(1), marker.group(2)
        if kind == "source" and arg not in known:
            out.append(f"{figure!r} cites {arg!r}, which docs/sources.md does not list")
        elif kind == "recorded" and not arg:
            out.append(f"{figure!r} has an empty recorded key")
        elif kind == "derived":
            try:
                value = derived_value(arg)
            except Exception as exc:  # noqa: BLE001 - any error in the expression is the author's to fix
                out.append(f"{figure!r}: derived expression {arg!r} fails: {exc}")
                continue
            pairs = list(zip(value, (first, m))) if isinstance(value, tuple) else [(value, m)]
            if len(pairs) != (2 if isinstance(value, tuple) else 1) or any(
                    abs(v - figure_value(q)) > resolution(q) * (1 + 1e-9) for v, q in pairs):
                out.append(f"{figure!r}: derived expression {arg!r} gives {value!r}, not the figure "
                           "to the digits quoted")
    for marker in MARKER.finditer(text):
        if marker.start() not in used:
            out.append(f"marker {marker.group(0)!r} does not follow a number (it must come right after "
                       "the number and its unit)")
    return out


def _cells(path: Path):
    nb = nbformat.read(path, as_version=4)
    for index, cell in enumerate(nb.cells):
        if cell.cell_type == "markdown" and "from" not in cell.metadata.get("hpclab", {}):
            yield index, cell.source                   # a linked solution cell is checked in notebooks/


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_figure_in_the_text_is_recorded_sourced_or_derived(path):
    known = sources()
    found = [f"{path.parent.name}/{path.name} cell {i}: {p}" for i, text in _cells(path) for p in problems(text, known)]
    assert not found, "\n".join(found)


def test_the_sources_list_names_the_documents():
    known = sources()
    assert {"fasrc-slides", "fasrc-code"} <= known, known
    for line in SOURCES.read_text().splitlines():
        if line.startswith("| `"):
            assert re.search(r"https?://|seeds/|\d{4}", line), f"a source names no address or publication: {line}"


# ---------------------------------------------------------------- the check itself

KNOWN = {"fasrc-slides", "fasrc-code"}


@pytest.mark.parametrize("text, expected", [
    # unbacked figures of every kind
    ("after 200 good steps the scale doubles", ["'200'"]),
    ("it took 0.135 ms on four A100s", ["'0.135 ms'"]),
    ("about 75 % of peak", ["'75 %'"]),
    ("1.16× raw NCCL, 2.07e12 bins/s, 10¹¹ bins and 8.33 · 10⁻¹⁰", ["'1.16×'", "'2.07e12 bins/s'", "'10¹¹'",
                                                                     "'8.33 · 10⁻¹⁰'"]),
    ("the 10,000 bins of the workshop", ["'10,000'"]),
    ("a 4096 matrix in 0.5 s and 1024 ms, 256 MiB at 290.9 GB/s", ["'0.5 s'", "'1024 ms'", "'290.9 GB/s'"]),
    ("157–220 µs host-staged", ["'157–220 µs'"]),
    # a marker that is not right after a number, an unknown source, a wrong derivation
    ("about ten times <!-- source: fasrc-slides -->", ["does not follow a number"]),
    ("2.5 of the bins <!-- source: fasrc-slides -->", ["'2.5'", "does not follow a number"]),
    ("0.150 ms<!-- source: a-blog -->", ["does not list"]),
    ("8 388 609<!-- derived: 256**3 / 2 -->", ["gives 8388608.0"]),
    ("0.2 %<!-- derived: 100 / 3 -->", ["gives 33.3"]),
    ("25 %<!-- derived: 1/0 -->", ["fails"]),
])
def test_the_check_catches(text, expected):
    found = problems(text, KNOWN)
    assert len(found) == len(expected), found
    for message, want in zip(found, expected):
        assert want in message, (message, want)


@pytest.mark.parametrize("text", [
    "rank 0 of 4 ranks in Exercise 2, a 6 → 4 → 2 MLP, notebook 05, C1 on H200, sm_90, F(3×3, 5×5)",
    "`--samples 1e10` and `N = 4096` in code, $2^{26}$ and $h^2/12 = 8.3\\cdot10^{-10}$ in math",
    "Salmon et al., 2011; run on 2026-11-22",
    "0.150 ms<!-- source: fasrc-slides --> and **97.0 %**<!-- recorded: ddp-digits/fp32/h200/1gpu/test_accuracy -->",
    "8 388 608<!-- derived: 256**3 / 2 -->, 33.3 %<!-- derived: 100 / 3 -->, 2¹⁶<!-- derived: 65536 -->",
    "157–220 µs<!-- source: fasrc-code --> host-staged, 90–95 %<!-- source: fasrc-slides -->",
    "6 × 10⁻⁸<!-- derived: 2**-24 -->, 10,000 bins<!-- source: fasrc-code -->, ≈10⁻¹⁶<!-- derived: 2**-53 -->",
])
def test_the_check_accepts(text):
    assert problems(text, KNOWN) == []
