"""An unfilled exercise stops the learner with the same message on every backend.

``hpclab exercises build`` replaces each answer with ``raise NotImplementedError(MESSAGE)``. Inside an
``@cuda.jit`` kernel that raise means nothing on a GPU: numba-cuda reports an exception raised in a
kernel only when the kernel was compiled with ``debug=True``, and otherwise the thread just returns
(the check then sees zeros, or uninitialised memory). So an exercise launches its kernel through
:func:`written`, which looks for the stub in the kernel's compiled Python code and raises from the host.
"""
from __future__ import annotations

MESSAGE = "exercise: write this part (see the instructions above)"


def _holds_stub(code) -> bool:
    return any(const == MESSAGE or (hasattr(const, "co_consts") and _holds_stub(const)) for const in code.co_consts)


def written(kernel):
    """``kernel`` itself once its stub has been replaced; until then NotImplementedError, raised here."""
    function = getattr(kernel, "py_func", kernel)
    if _holds_stub(function.__code__):
        raise NotImplementedError(f"{MESSAGE}: {function.__name__} still holds the line that raises this")
    return kernel
