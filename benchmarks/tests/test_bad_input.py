"""``python -m benchmarks``: bad input stops a benchmark with one line naming the option, the value and what is
allowed, exit status 2 (as ``hpclab`` commands do: tests/test_bad_input.py)."""
import contextlib
import io
import time

import pytest

from benchmarks.__main__ import main
from tests.test_bad_input import _ids, refused

BENCH = [
    (["pi", "--repeats", "0"], "argument --repeats: 0 is out of range"),
    (["pi", "--seconds", "nan"], "argument --seconds: 'nan' is not a finite number"),
    (["matmul", "--sizes", "64,"], "argument --sizes: '64,' has an empty item"),
    (["matmul", "--layouts", "nn,nx"], "argument --layouts: unknown layout 'nx'; choose from nn, tn, nt, tt"),
    (["matmul", "--random", "-1"], "argument --random: -1 is out of range"),
    (["allreduce", "--sizes", "abc"], "argument --sizes: 'abc' is not a message size"),
    (["allreduce", "--sizes", "1K,"], "argument --sizes: '1K,' has an empty item"),
    (["conv", "scaling", "--height", "0"], "argument --height: 0 is out of range"),
    (["conv", "trunk", "--batch", "0"], "argument --batch: 0 is out of range"),
    (["conv", "trunk", "--method", "fft"], "argument --method: invalid choice: 'fft'"),
    (["ddp", "--width", "0"], "argument --width: 0 is out of range"),
    (["ddp", "--lrs", "1e-3,nan"], "argument --lrs: in '1e-3,nan': 'nan' is not a finite number"),
    (["nosuch"], "unknown benchmark 'nosuch'"),
]


@pytest.mark.parametrize("argv, words", BENCH, ids=_ids(BENCH))
def test_benchmarks_refuse(argv, words):
    out, err = io.StringIO(), io.StringIO()
    t0 = time.monotonic()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    refused(code, out.getvalue(), err.getvalue(), time.monotonic() - t0, words)
