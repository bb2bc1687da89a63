"""Tensors: placeholders, compute ops, reduce axes and reductions.

A :class:`Tensor` is either a placeholder (an input) or a compute op, whose
element ``t[i0, i1, ...]`` is the scalar expression ``body`` over the axis
variables ``axes``.  Tensors are compared by identity: two placeholders with
the same shape are different inputs.
"""
from __future__ import annotations

import inspect
import itertools

import numpy as np

from . import dtype as dt
from .expr import Expr, Load, Reduce, ScanState, Var, as_expr, cast, const, identity_of, reduce, var
from .visit import children, topo_order, trampoline

_NAMES = itertools.count()


class Tensor:
    """An n-dimensional array of scalars of one dtype, read with ``t[i, j]``."""

    __slots__ = ("name", "shape", "dtype", "axes", "body", "_inputs", "__weakref__")

    def __init__(self, name, shape, dtype, axes=None, body=None):
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "shape", shape)
        object.__setattr__(self, "dtype", dtype)
        object.__setattr__(self, "axes", axes)
        object.__setattr__(self, "body", body)
        object.__setattr__(self, "_inputs", None)

    def __setattr__(self, name, value):
        raise AttributeError("tensors are immutable")

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def is_placeholder(self) -> bool:
        return self.body is None

    @property
    def inputs(self) -> list["Tensor"]:
        """The tensors this compute op reads, in first-read order (a scan's
        result: the initial values and what its update reads besides the state)."""
        if self._inputs is None:
            if isinstance(self.body, ScanState):
                reads = dict.fromkeys(self.body.scan.external)
            else:
                reads = {} if self.body is None else {
                    node.tensor: None for node in topo_order([self.body]) if isinstance(node, Load)}
            object.__setattr__(self, "_inputs", tuple(reads))
        return list(self._inputs)

    def __getitem__(self, indices) -> Load:
        if not isinstance(indices, tuple):
            indices = (indices,)
        if len(indices) != self.ndim:
            raise IndexError(f"tensor '{self.name}' has {self.ndim} dimension(s) but was indexed "
                             f"with {len(indices)} index(es)")
        out = []
        for d, ix in enumerate(indices):
            if isinstance(ix, slice):
                raise TypeError(f"tensor '{self.name}': slices are not supported; write a te.compute")
            try:
                e = as_expr(ix)
            except (TypeError, ValueError) as err:
                raise type(err)(f"tensor '{self.name}': index {d}: {err}") from None
            if not (dt.is_int(e.dtype)):
                raise TypeError(f"tensor '{self.name}': index {d} has dtype {e.dtype}; "
                                "indices must be integer expressions")
            out.append(cast(dt.INDEX, e))
        return Load(self, tuple(out))

    def __call__(self, *indices):
        return self[indices]

    def __len__(self):
        if not self.shape:
            raise TypeError(f"tensor '{self.name}' is 0-dimensional and has no len()")
        return self.shape[0]

    def __iter__(self):
        raise TypeError(f"tensor '{self.name}' is not iterable; index it with t[i, j] inside te.compute")

    def __repr__(self):
        kind = "placeholder" if self.is_placeholder else "scan" if isinstance(self.body, ScanState) else "compute"
        return f"Tensor({self.name!r}, shape={self.shape}, dtype={self.dtype}, {kind})"


def _is_int(v) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))


def _shape(shape, who: str) -> tuple:
    if isinstance(shape, (int, np.integer)):
        shape = (shape,)
    try:
        shape = tuple(shape)
    except TypeError:
        raise TypeError(f"{who}: shape must be a tuple of ints, got {shape!r}") from None
    for s in shape:
        if not _is_int(s):
            raise TypeError(f"{who}: shape entries must be ints, got {s!r} in {shape}")
        if s < 0:
            raise ValueError(f"{who}: shape entries must be non-negative, got {shape}")
        if s >= 2**63:
            raise ValueError(f"{who}: shape entries must be below 2**63 (index variables are int64), got {shape}")
    return tuple(int(s) for s in shape)


def check_name(name, who: str) -> str:
    """``name`` if it is a printable str: names reach messages, printed
    formulas and LLVM symbols, where a newline or NUL broke or crashed LLVM."""
    if not isinstance(name, str):
        raise TypeError(f"{who}: name must be a str, got {name!r} of type {type(name).__name__}")
    if not name.isprintable():
        raise ValueError(f"{who}: name {name!r} has a non-printable character")
    return name


def placeholder(shape, dtype="float32", name="placeholder") -> Tensor:
    """``te.placeholder``: an input tensor of ``shape`` and ``dtype``."""
    check_name(name, "te.placeholder")
    shape = _shape(shape, f"te.placeholder '{name}'")
    try:
        return Tensor(name, shape, dt.canonical(dtype))
    except TypeError as e:
        raise TypeError(f"te.placeholder '{name}': {e}") from None


def _arity(fcompute, ndim: int, name: str):
    """The axis names ``fcompute`` declares, checking it takes ``ndim`` indices."""
    try:
        params = list(inspect.signature(fcompute).parameters.values())
    except (TypeError, ValueError):
        return [f"i{d}" for d in range(ndim)]
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    required = [p for p in positional if p.default is p.empty]
    star = any(p.kind == p.VAR_POSITIONAL for p in params)
    if len(required) > ndim or (not star and len(positional) < ndim):
        raise TypeError(f"te.compute '{name}': fcompute takes {len(positional)} index argument(s) "
                        f"but the shape has {ndim} dimension(s)")
    names = [p.name for p in positional[:ndim]]
    return names + [f"i{d}" for d in range(len(names), ndim)]


def compute(shape, fcompute, name="compute") -> Tensor:
    """``te.compute``: the tensor whose element at ``(i0, i1, ...)`` is ``fcompute(i0, i1, ...)``."""
    check_name(name, "te.compute")
    shape = _shape(shape, f"te.compute '{name}'")
    if not callable(fcompute):
        raise TypeError(f"te.compute '{name}': fcompute must be a function of the indices, "
                        f"got {type(fcompute).__name__}")
    axes = tuple(var(n, (0, s)) for n, s in zip(_arity(fcompute, len(shape), name), shape))
    body = fcompute(*axes)
    if isinstance(body, Tensor):
        raise TypeError(f"te.compute '{name}': fcompute returned tensor '{body.name}'; "
                        "return an element such as t[i, j]")
    if isinstance(body, (list, tuple)):
        raise TypeError(f"te.compute '{name}': fcompute must return one scalar expression")
    try:
        body = as_expr(body)
    except TypeError as e:
        raise TypeError(f"te.compute '{name}': {e}") from None
    _check_axes(body, axes, name)
    return Tensor(name, shape, body.dtype, axes, body)


def _check_axes(body: Expr, axes, name: str):
    """Every variable is an axis of this compute or of one enclosing reduction."""
    owner = {}
    for node in topo_order([body]):
        if isinstance(node, Reduce):
            for ax in node.axes:
                if ax in owner and owner[ax] is not node:
                    raise ValueError(f"te.compute '{name}': reduce axis '{ax.name}' is used by two "
                                     "reductions; create one te.reduce_axis per reduction")
                owner[ax] = node
    trampoline(_check_scope, body, frozenset(axes), name, set())


def _check_scope(e: Expr, scope: frozenset, name: str, seen: set):
    """Every variable in ``e`` is in ``scope`` (a generator for :func:`trampoline`)."""
    if (e, scope) in seen:
        return
    seen.add((e, scope))
    if isinstance(e, Var):
        if e not in scope:
            raise ValueError(f"te.compute '{name}': variable '{e.name}' is not in scope here: it is "
                             "an axis of another te.compute or a reduce axis used outside its reduction")
        return
    if isinstance(e, Reduce):
        inner = scope
        for ax, (lo, ext) in zip(e.axes, e.doms):   # a domain may use the axes before it
            if ax in inner:
                raise ValueError(f"te.compute '{name}': the reduction runs over '{ax.name}', an axis of "
                                 "this tensor; reduce over a te.reduce_axis")
            yield lo, inner, name, seen
            yield ext, inner, name, seen
            inner = inner | {ax}
        yield e.body, inner, name, seen
        return
    for c in children(e):
        yield c, scope, name, seen


def reduce_axis(dom, name="k") -> Var:
    """``te.reduce_axis``: a reduction variable over ``range(dom)`` or ``range(lo, hi)``."""
    check_name(name, "te.reduce_axis")
    try:
        bounds = (0, dom) if _is_int(dom) else tuple(dom)
    except TypeError:
        bounds = ()
    if len(bounds) != 2 or not all(_is_int(v) for v in bounds):
        raise TypeError(f"te.reduce_axis '{name}': dom must be an int or (begin, end) ints, got {dom!r}")
    lo, hi = (int(v) for v in bounds)
    if hi < lo:
        raise ValueError(f"te.reduce_axis '{name}': range [{lo}, {hi}) ends before it begins")
    if lo < -2**63 or hi - lo >= 2**63 or hi >= 2**63:
        raise ValueError(f"te.reduce_axis '{name}': range [{lo}, {hi}) does not fit int64 index variables")
    return var(name, (lo, hi - lo))


def _reduction(op: str, expr, axis, where=None) -> Expr:
    axes = axis if isinstance(axis, (list, tuple)) else [axis]
    if not axes:
        raise ValueError(f"te.{op}: axis must name at least one te.reduce_axis")
    for ax in axes:
        if not isinstance(ax, Var) or ax.dom is None:
            raise TypeError(f"te.{op}: axis must be te.reduce_axis variables, got {ax!r}")
    if len(set(axes)) != len(axes):
        raise ValueError(f"te.{op}: axis lists the same reduce axis twice")
    body = as_expr(expr)
    if body.dtype == "bool":
        body = cast("int32", body)
    if where is not None:
        from .expr import _cond, select
        body = select(_cond(where, f"te.{op} where="), body, const(identity_of(op, body.dtype), body.dtype))
    doms = tuple((const(ax.dom[0], dt.INDEX), const(ax.dom[1], dt.INDEX)) for ax in axes)
    return reduce(op, body, axes, doms)


def sum(expr, axis, where=None) -> Expr:  # noqa: A001 - the public name is te.sum
    """``te.sum``: sum of ``expr`` over the reduce axes ``axis``."""
    return _reduction("sum", expr, axis, where)


def max(expr, axis, where=None) -> Expr:  # noqa: A001
    """``te.max``: maximum of ``expr`` over the reduce axes ``axis``."""
    return _reduction("max", expr, axis, where)


def min(expr, axis, where=None) -> Expr:  # noqa: A001
    """``te.min``: minimum of ``expr`` over the reduce axes ``axis``."""
    return _reduction("min", expr, axis, where)


def prod(expr, axis, where=None) -> Expr:
    """``te.prod``: product of ``expr`` over the reduce axes ``axis``."""
    return _reduction("prod", expr, axis, where)
