"""``te.check_gradient``: te.gradient against central finite differences.

Both sides are evaluated on a float64 copy of the program (every float32
placeholder, constant and cast becomes float64), so the finite differences
are accurate enough to judge the symbolic gradient itself.
"""
from __future__ import annotations

import numpy as np

from . import dtype as dt
from .expr import Cast, Const, Load, ScanState, cast, const
from .graph import tensors_in_order
from .scan import ScanOp
from .tensor import Tensor, placeholder
from .visit import rewrite


def as_float64(tensors) -> dict:
    """A float64 copy of the graph below ``tensors``: ``{old tensor: new tensor}``."""
    new = {}

    def widen(d):
        return "float64" if dt.is_float(d) else d

    def fix(node, rebuilt):
        if isinstance(node, Const) and dt.is_float(node.dtype):
            return const(node.value, "float64")
        if isinstance(node, Cast) and node.to == "float32":
            return cast("float64", rebuilt.a if isinstance(rebuilt, Cast) else rebuilt)
        if isinstance(node, Load):
            return Load(new[node.tensor], rebuilt.indices)
        return None

    def convert(t):
        if t.is_placeholder:
            new[t] = placeholder(t.shape, widen(t.dtype), t.name)
        else:
            body = rewrite([t.body], fix)[0]
            new[t] = Tensor(t.name, t.shape, body.dtype, t.axes, body)

    wide = {}
    for t in tensors_in_order(tensors):
        if not isinstance(t.body, ScanState):
            convert(t)
            continue
        op = t.body.scan                    # a scan: its states and step too
        if op not in wide:
            for x in op.state + op.chain:
                convert(x)
            wide[op] = ScanOp(op.name, *(tuple(new[x] for x in part) for part in (op.init, op.update, op.state)),
                              op.inputs, internal=True)
        new[t] = wide[op].output(t.body.which)
    return new


def _array(value, x: Tensor) -> np.ndarray:
    """A fresh array of ``x``'s dtype holding ``value``."""
    try:
        return np.array(value, dtype=x.dtype, copy=True)
    except (TypeError, ValueError) as e:
        raise TypeError(f"te.check_gradient: the value for '{x.name}' is not an array of numbers: {e}") from None


def check_gradient(output, inputs, values, head=None, rtol=1e-4, atol=1e-6, eps=1e-6):
    """Compare ``te.gradient(output, inputs, head)`` with central differences.

    ``values`` are numpy arrays for ``inputs``; ``head`` a numpy array of the
    output's shape (or None for all ones).  Raises ``AssertionError`` naming
    the input and the worst element when they disagree beyond
    ``atol + rtol * |numeric|``.  Returns the analytic gradients (float64).
    """
    from . import build
    from .gradient import gradient
    inputs = [inputs] if isinstance(inputs, Tensor) else list(inputs)
    for what, t in [("output", output)] + [(f"inputs[{n}]", x) for n, x in enumerate(inputs)]:
        if not isinstance(t, Tensor):
            raise TypeError(f"te.check_gradient: {what} must be a te tensor, got {type(t).__name__}")
    if len(values) != len(inputs):
        raise ValueError(f"te.check_gradient: {len(inputs)} inputs but {len(values)} values")
    if not (rtol >= 0 and atol >= 0 and eps > 0):
        raise ValueError(f"te.check_gradient: needs rtol >= 0, atol >= 0 and eps > 0, "
                         f"got rtol={rtol}, atol={atol}, eps={eps}")
    g64 = as_float64([output] + inputs)
    ins = [g64[x] for x in inputs]
    out = g64[output]
    arrays = [_array(v, x) for v, x in zip(values, ins)]
    h_tensor = placeholder(out.shape, "float64", "head") if head is not None else None
    h_value = [np.asarray(head, dtype="float64")] if head is not None else []
    grads = gradient(out, ins, head=h_tensor)
    extra = [h_tensor] if head is not None else []
    analytic = build(ins + extra, grads)(*arrays, *h_value)
    analytic = analytic if isinstance(analytic, tuple) else (analytic,)
    forward = build(ins, [out])
    weights = h_value[0] if head is not None else 1.0

    def loss():
        return float(np.sum(np.asarray(forward(*arrays), dtype="float64") * weights))

    for x, arr, ana in zip(inputs, arrays, analytic):
        if not dt.is_float(arr.dtype.name):
            continue
        numeric = np.zeros(arr.shape)
        flat = arr.reshape(-1)
        for n in range(flat.size):
            keep = flat[n]
            step = eps * max(1.0, abs(keep))
            flat[n] = keep + step
            up = loss()
            flat[n] = keep - step
            down = loss()
            flat[n] = keep
            numeric.reshape(-1)[n] = (up - down) / (2 * step)
        err = np.abs(ana - numeric) - (atol + rtol * np.abs(numeric))
        err = np.where(np.isnan(err), np.inf, err)     # a NaN on either side verifies nothing: a mismatch
        if err.size and err.max() > 0:
            at = np.unravel_index(int(np.argmax(err)), err.shape)
            raise AssertionError(
                f"te.check_gradient: gradient of '{x.name}' at {tuple(int(a) for a in at)}: "
                f"te.gradient gives {ana[at]!r}, finite differences give {numeric[at]!r} "
                f"(rtol={rtol}, atol={atol})")
    return list(analytic)
