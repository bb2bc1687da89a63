"""Scalar dtypes and the promotion rules of te-autodiff.

Rules (written down once, used by every operator):

* The dtypes are ``bool < int32 < int64 < float32 < float64``.
* A binary arithmetic operator returns the higher of its two operand dtypes,
  except that ``bool`` arithmetic is done in ``int32``.  Floats win over ints
  without being widened: ``int64 + float32 -> float32`` (as in JAX).
* Python literals are *weak*: ``x + 1`` and ``x * 0.5`` keep ``x``'s dtype when
  ``x`` is float; an int expression times a Python float becomes ``float32``.
  A literal on its own is ``int32`` (``int64`` if it does not fit), ``float32``
  or ``bool``.
* ``/`` is true division and needs a float operand; ``//`` and ``%`` use floor
  semantics on ints and floats.  Intrinsics (``exp``, ``tanh``...) turn int
  arguments into ``float32``.
* Index variables and tensor indices are ``int64``; any int dtype may index.
"""
from __future__ import annotations

import numpy as np

DTYPES = ("bool", "int32", "int64", "float32", "float64")
_RANK = {name: rank for rank, name in enumerate(DTYPES)}
INDEX = "int64"
DEFAULT_FLOAT = "float32"


def canonical(dtype) -> str:
    """Return the canonical dtype name for a string, numpy dtype or Python type."""
    if isinstance(dtype, str) and dtype in _RANK:
        return dtype
    try:
        name = None if dtype is None else np.dtype(dtype).name     # numpy reads None as float64
    except TypeError:
        name = None
    if name not in _RANK:
        raise TypeError(f"unsupported dtype {dtype!r}; expected one of {', '.join(DTYPES)}")
    return name


def is_float(dtype: str) -> bool:
    return dtype in ("float32", "float64")


def is_int(dtype: str) -> bool:
    return dtype in ("int32", "int64")


def is_bool(dtype: str) -> bool:
    return dtype == "bool"


def promote(a: str, b: str) -> str:
    """The dtype of an arithmetic operator applied to dtypes ``a`` and ``b``."""
    top = a if _RANK[a] >= _RANK[b] else b
    return "int32" if top == "bool" else top


def float_of(dtype: str) -> str:
    """The float dtype an intrinsic computes in for an argument of ``dtype``."""
    return dtype if is_float(dtype) else DEFAULT_FLOAT


def literal_dtype(value) -> str:
    """The dtype of a Python literal standing on its own."""
    if isinstance(value, (bool, np.bool_)):
        return "bool"
    if isinstance(value, (int, np.integer)):
        return "int32" if -2**31 <= int(value) < 2**31 else "int64"
    if isinstance(value, (float, np.floating)):
        return DEFAULT_FLOAT
    raise TypeError(f"cannot use {value!r} of type {type(value).__name__} in a tensor expression")


def weak_literal_dtype(value, other: str) -> str:
    """The dtype a Python literal takes next to an expression of dtype ``other``."""
    own = literal_dtype(value)
    if own == "bool":
        return "bool" if other == "bool" else other
    if own in ("int32", "int64"):
        return other if other != "bool" else own
    return other if is_float(other) else DEFAULT_FLOAT


def numpy_dtype(dtype: str) -> np.dtype:
    return np.dtype(dtype)
