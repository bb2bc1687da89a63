"""From tensor expressions to native code: loop IR, LLVM IR (llvmlite), JIT kernels.

``build`` and ``cost`` are re-exported by ``te_autodiff`` as ``te.build`` and
``te.cost``.
"""
from .pipeline import build, cost
from .runtime import Kernel
from .target import Target

__all__ = ["build", "cost", "Kernel", "Target"]
