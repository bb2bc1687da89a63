"""The public operator functions of SPEC (``te.exp`` ... ``te.clip``,
``te.power``, ``te.maximum``), one per entry of the operator table
(``ops.py``) that names one, with the table's docstring."""
from .ops import OPS, public_function

__all__ = [op.public for op in OPS.values() if op.public]
globals().update({op.public: public_function(op) for op in OPS.values() if op.public})
