"""Four float32 values in one 16-byte memory access, which Numba does not emit by itself.

The compiler merges four 4-byte *shared* loads into one when it can prove the address a multiple of 16
(``cuda.shared.array(..., alignment=16)``), but it knows nothing of a global array's alignment.
``load4`` and ``store4`` state it (``align=16`` on one ``<4 x float>`` access): one LDG.128 or STS.128
instead of four instructions. The caller guarantees it: ``j`` (or ``i``) a multiple of 4 and the array's
rows starting on 16-byte boundaries. On the simulator (Python, not LLVM) they are plain device functions.
"""
from __future__ import annotations

from hpclab import backend
from hpclab.backend import cuda as _cuda

cuda = _cuda()


def _gpu_functions():
    from llvmlite import ir
    from numba import types
    from numba.cuda import cgutils
    from numba.cuda.extending import intrinsic

    def pointer(context, builder, sig, args, n_index):
        """Address of the indexed element, as a pointer to four of them."""
        aryty = sig.args[0]
        ary = context.make_array(aryty)(context, builder, value=args[0])
        index = [context.cast(builder, v, t, types.intp) for v, t in zip(args[1:1 + n_index], sig.args[1:])]
        ptr = cgutils.get_item_pointer(context, builder, aryty, ary, index, wraparound=False)
        vec = ir.VectorType(context.get_value_type(aryty.dtype), 4)
        return builder.bitcast(ptr, vec.as_pointer()), vec

    @intrinsic
    def load4(typingctx, array, row, col):
        sig = types.UniTuple(array.dtype, 4)(array, row, col)

        def codegen(context, builder, sig, args):
            ptr, _ = pointer(context, builder, sig, args, 2)
            vec = builder.load(ptr, align=16)
            values = [builder.extract_element(vec, ir.Constant(ir.IntType(32), k)) for k in range(4)]
            return context.make_tuple(builder, sig.return_type, values)
        return sig, codegen

    @intrinsic
    def store4(typingctx, array, i, v0, v1, v2, v3):
        sig = types.void(array, i, v0, v1, v2, v3)

        def codegen(context, builder, sig, args):
            ptr, vec_type = pointer(context, builder, sig, args, 1)
            vec = ir.Constant(vec_type, ir.Undefined)
            for k in range(4):
                value = context.cast(builder, args[2 + k], sig.args[2 + k], sig.args[0].dtype)
                vec = builder.insert_element(vec, value, ir.Constant(ir.IntType(32), k))
            builder.store(vec, ptr, align=16)
            return context.get_dummy_value()
        return sig, codegen

    return load4, store4


def _simulator_functions():
    @cuda.jit(device=True)
    def load4(array, row, col):
        return array[row, col], array[row, col + 1], array[row, col + 2], array[row, col + 3]

    @cuda.jit(device=True)
    def store4(array, i, v0, v1, v2, v3):
        array[i], array[i + 1], array[i + 2], array[i + 3] = v0, v1, v2, v3

    return load4, store4


# load4(array, row, col) -> (array[row, col], ..., array[row, col + 3]), col a multiple of 4;
# store4(array, i, v0, v1, v2, v3): array[i:i + 4] = v0..v3, i a multiple of 4.
load4, store4 = _gpu_functions() if backend.name() == "gpu" else _simulator_functions()


def aligned(x) -> bool:
    """Whether a device array's rows start on 16-byte boundaries (what load4 needs), in every matrix of a 3-d
    array; the simulator's device arrays give their address through NumPy's array interface."""
    iface = getattr(x, "__cuda_array_interface__", None) or x.__array_interface__
    address = iface["data"][0]
    return (address % 16 == 0 and all(s % 16 == 0 for s in x.strides[:-1])
            and x.strides[-1] == x.dtype.itemsize)
