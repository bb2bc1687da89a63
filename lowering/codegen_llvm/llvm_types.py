"""LLVM types and values shared by the code generator: te dtypes as LLVM
types in registers and in memory, their sizes and alignment, the fast-math
flags of float arithmetic, intrinsic name mangling and distinct metadata
(loop ids and access groups)."""
from __future__ import annotations

from llvmlite import ir

from te_autodiff import dtype as dt

I1, I8, I32, I64 = ir.IntType(1), ir.IntType(8), ir.IntType(32), ir.IntType(64)
PTR = ir.PointerType()
VALUE_TYPE = {"bool": I1, "int32": ir.IntType(32), "int64": I64,
              "float32": ir.FloatType(), "float64": ir.DoubleType()}
MEMORY_TYPE = {**VALUE_TYPE, "bool": I8}
FAST = ("reassoc", "contract", "nsz")
ORDERED = ("nsz",)                    # in the association written, fused only by the emitter: ordered_nodes



def mangle(t) -> str:
    """The type suffix of an overloaded intrinsic: f32, i64, v16f32..."""
    if isinstance(t, ir.VectorType):
        return f"v{t.count}{mangle(t.element)}"
    if isinstance(t, ir.FloatType):
        return "f32"
    if isinstance(t, ir.DoubleType):
        return "f64"
    if isinstance(t, ir.PointerType):
        return "p0"
    return f"i{t.width}"


def element_type(t):
    return t.element if isinstance(t, ir.VectorType) else t


def shaped(scalar, like):
    """``scalar`` type, as a vector when ``like`` is a vector value."""
    return ir.VectorType(scalar, like.type.count) if isinstance(like.type, ir.VectorType) else scalar


def kind_of(dtype: str) -> str:
    return "f" if dt.is_float(dtype) else "b" if dtype == "bool" else "i"


class _DistinctMD(ir.values.MDValue):
    """A ``distinct`` metadata node (access groups, loop ids), compared by identity."""

    def descr(self, buf):
        buf.append("distinct ")
        super().descr(buf)

    __hash__ = object.__hash__

    def __eq__(self, other):
        return self is other

    def __ne__(self, other):
        return self is not other


def distinct_md(module, operands=()):
    return _DistinctMD(module, operands, name=str(len(module.metadata)))


ITEMSIZE = {"bool": 1, "int32": 4, "int64": 8, "float32": 4, "float64": 8}


def element_align(buf) -> int:
    """Element alignment (inputs may be any numpy array, so no more is promised)."""
    return ITEMSIZE[buf.dtype]
