"""Command-line input, checked once and before any work.

Every ``hpclab`` command builds its parser from :class:`Parser` and the types below: a bad value stops
it with ONE line naming the option, the value and what is allowed, exit status 2 and no traceback.
``count`` takes ``1e10``, ``1_000_000`` and ``2**20``, not ``inf``, ``nan``, ``2.5`` or ``1e400``; the
comma lists refuse empty items such as ``v1,``.
"""
from __future__ import annotations

import argparse
import math
import re
import tempfile
from pathlib import Path


class UsageError(ValueError):
    """Bad input, found before any work: one line naming the option, the value and what is allowed."""


class Help(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """Descriptions as written; each option's default shown, unless None or its help already says it."""

    def _get_help_string(self, action):
        shown = action.default is None or "default" in (action.help or "") or action.default is False
        return action.help if shown else super()._get_help_string(action)


class Parser(argparse.ArgumentParser):
    """An ArgumentParser that raises :class:`UsageError` instead of printing usage and exiting,
    so every command reports bad input the same way (and the runner can agree on it across ranks)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **{"formatter_class": Help, **kwargs})

    def error(self, message: str):
        raise UsageError(f"{self.prog}: error: {message}")


UNBOUNDED = 10 ** 100       # the largest count accepted where an option has no upper limit
_POWER = re.compile(r"^(\d+)\*\*(\d+)$")
_EXAMPLES = "e.g. 1000000, 1e6 or 2**20"


def _pretty(n: int) -> str:
    """A limit as people read it: 4503599627370495 (2^52 - 1)."""
    if n >= 1 << 20 and (n + 1) & n == 0:
        return f"{n} (2^{n.bit_length()} - 1)"
    if n >= 1 << 20 and n & (n - 1) == 0:
        return f"{n} (2^{n.bit_length() - 1})"
    return str(n)


def parse_whole(text: str) -> int | float:
    """``text`` as a whole number (``math.inf`` for a power too large to compute), or a ``ValueError``
    saying what is wrong with the text itself."""
    s = str(text).strip().replace("_", "").replace(" ", "")
    m = _POWER.match(s)
    if m:
        base, exp = int(m[1]), int(m[2])
        if base > 1 and exp * base.bit_length() > 4096:
            return math.inf
        return base ** exp
    try:
        return int(s, 0)
    except ValueError:
        pass
    try:
        value = float(s)
    except ValueError:
        raise ValueError(f"{text!r} is not a number") from None
    if math.isinf(value) and s.lstrip("+-").lower() not in ("inf", "infinity"):
        return math.inf if value > 0 else -math.inf        # 1e400: finite text, too large
    if not math.isfinite(value):
        raise ValueError(f"{text!r} is not a finite number")
    if value != int(value):
        raise ValueError(f"{text!r} is not a whole number")
    return int(value)


def count(lo: int = 1, hi: int | None = (1 << 63) - 1):
    """argparse type: a whole number with ``lo <= value <= hi`` (default 1 to 2^63 - 1)."""
    span = (f"a whole number from {_pretty(lo)} to {_pretty(hi)}" if hi is not None
            else f"a whole number of at least {_pretty(lo)}")

    def parse(text: str) -> int:
        try:
            value = parse_whole(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(f"{exc}; give {span} ({_EXAMPLES})") from None
        if value < lo or (hi is not None and value > hi):
            shown = value if abs(value) < 10 ** 21 else text      # not 300 digits of 2**1024
            raise argparse.ArgumentTypeError(f"{shown} is out of range; give {span}")
        if value > UNBOUNDED:       # no upper limit of its own, but no count is this large either
            raise argparse.ArgumentTypeError(f"{text} is too large; give {span} below 1e100")
        return int(value)

    return parse


def seed(hi: int = (1 << 64) - 1):
    """argparse type: a random seed, a whole number from 0 to ``hi``."""
    return count(0, hi)


def real(lo: float, hi: float | None = None, lo_open: bool = False, hi_open: bool = False):
    """argparse type: a finite float from ``lo`` (to ``hi``); ``lo_open``/``hi_open`` exclude the ends."""
    if hi is not None:
        span = f"a finite number with {lo:g} {'<' if lo_open else '<='} value {'<' if hi_open else '<='} {hi:g}"
    else:
        span = f"a finite number {'above' if lo_open else 'of at least'} {lo:g}"

    def parse(text: str) -> float:
        try:
            value = float(str(text).strip().replace("_", ""))
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number; give {span}") from None
        if not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"{text!r} is not a finite number; give {span}")
        too_high = hi is not None and (value > hi or (hi_open and value == hi))
        if value < lo or (lo_open and value == lo) or too_high:
            raise argparse.ArgumentTypeError(f"{value:g} is out of range; give {span}")
        return value

    return parse


def _items(text: str, example: str) -> list[str]:
    items = [v.strip() for v in str(text).split(",")]
    if not str(text).strip() or any(not v for v in items):
        raise argparse.ArgumentTypeError(f"{text!r} has an empty item; give a comma list such as {example}")
    return items


def count_list(lo: int = 1, hi: int | None = (1 << 63) - 1, example: str = "1,2,4"):
    """argparse type: comma-separated whole numbers, each from ``lo`` to ``hi``; a tuple."""
    return _list_of(count(lo, hi), example)


def real_list(lo: float, lo_open: bool = False, example: str = "1e-3,4e-3"):
    """argparse type: comma-separated finite numbers from ``lo``; a tuple."""
    return _list_of(real(lo, lo_open=lo_open), example)


def _list_of(one, example: str):
    """argparse type: comma-separated items, each parsed by ``one``; a tuple."""

    def parse(text: str) -> tuple:
        values = []
        for item in _items(text, example):
            try:
                values.append(one(item))
            except argparse.ArgumentTypeError as exc:
                raise argparse.ArgumentTypeError(f"in {text!r}: {exc}") from None
        return tuple(values)

    return parse


def choice_list(choices, alone: tuple[str, ...] = (), noun: str = "item"):
    """argparse type: a comma list of ``choices`` (case-insensitive), or one of ``alone`` by
    itself (e.g. ``all``); a tuple of lower-case names, repeats dropped."""
    allowed = ", ".join(choices)
    hint = (f"{' or '.join(alone)}, or " if alone else "") + f"a comma list of {allowed}"

    def parse(text: str) -> tuple[str, ...]:
        if str(text).strip().lower() in alone:
            return (str(text).strip().lower(),)
        items = [v.lower() for v in _items(text, ",".join(list(choices)[:2]))]
        bad = [v for v in items if v not in choices]
        if bad:
            raise argparse.ArgumentTypeError(f"unknown {noun} {', '.join(bad)}; give {hint}")
        return tuple(dict.fromkeys(items))

    return parse


def output_folder(path, option: str, prog: str) -> Path:
    """Make ``path`` a folder this process can write into (a file made there and removed), or say why not."""
    folder = Path(path)
    for part in [folder, *folder.parents]:
        if part.exists() and not part.is_dir():
            where = "is a file" if part == folder else f"lies under {part}, which is a file"
            raise UsageError(f"{prog}: error: {option} {path} {where}; give a folder")
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise UsageError(f"{prog}: error: {option} {path}: cannot write there ({reason}); "
                         "give a folder you can write to") from None
    return folder
