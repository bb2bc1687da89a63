"""te-autodiff: differentiate tensor expressions and compile them to native code.

Used as ``import te_autodiff as te``; the names below are the public contract
fixed by SPEC.md.
"""
from .dtype import DTYPES
from .expr import (Expr, Var, all_ as all, any_ as any, equal, literal as const, logic_not as not_, not_equal,
                   select, select as if_then_else)
from . import intrinsics
from .intrinsics import *  # noqa: F401,F403 - te.exp ... te.clip, te.power: one per operator of ops.py
from .tensor import Tensor, compute, max, min, placeholder, prod, reduce_axis, sum
from .gradient import gradient
from .jacobian import jacobian
from .pretty import pretty
from .scan import scan
from .testing import check_gradient


def build(inputs, outputs, name=None, store=(), recompute=(), target=None):
    """Compile ``outputs`` as functions of the placeholders ``inputs`` for
    ``target`` (see lowering.build); tensors in ``store`` always get a buffer,
    tensors in ``recompute`` are always inlined."""
    from lowering import build as _build
    return _build(inputs, outputs, name=name, store=store, recompute=recompute, target=target)


def cost(inputs, outputs, store=(), recompute=(), target=None) -> dict:
    """Exact iteration count and temporary bytes of the lowered program (see lowering.cost)."""
    from lowering import cost as _cost
    return _cost(inputs, outputs, store=store, recompute=recompute, target=target)


def target(name=None):
    """The CPU description kernels are compiled for: ``name`` as in
    ``te.build(..., target=name)`` (None: ``TE_TARGET`` or this machine)."""
    from lowering.target import target as _target
    return _target(name)


__all__ = [
    "DTYPES", "Expr", "Var", "Tensor", "placeholder", "compute", "reduce_axis", "sum", "max", "min",
    "prod", "const", "equal", "not_equal", "all", "any", "not_", "if_then_else", "select",
    *intrinsics.__all__,
    "scan", "gradient", "jacobian", "pretty", "check_gradient", "build", "cost", "target",
]
