"""From tensor expressions to native code: loop IR, LLVM IR (llvmlite), JIT kernels.

``build`` and ``cost`` are re-exported by ``te_autodiff`` as ``te.build`` and
``te.cost``.
"""
from .cost import cost
from .runtime import Kernel, build

__all__ = ["build", "cost", "Kernel"]
