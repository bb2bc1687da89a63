"""Uniform values: a transcendental function evaluated more often than it
has distinct values gets a stage of its own.

A stage computes each element's value where the element is stored, so a
value that does not move with every output axis is evaluated again for
each element that reads it.  Two cases cost whole evaluations:

* it does not move with the vector axis ``j`` and a row of ``j`` is short:
  it is evaluated once per row, or once per piece of a row (a tile's
  vectors, a remainder), for fewer elements than the lanes of a tile
  (bundle adjustment's ``cos θ`` and ``sin θ`` of each observation, read by
  the 11 entries of its camera's gradient; a row shorter than a vector of a
  temporary, such as its three rotated coordinates, is unrolled before,
  ``short_rows.py``, and computes such a value once);
* it moves with ``j`` but not with another output axis: the vector loop
  runs inside that axis's loop and evaluates it again on each of its
  iterations (``exp(b[j])`` in ``x[i, j] * exp(b[j])``, or ``cos θ`` when
  the observations run in lanes and the coordinate outside).

Computed in a stage over the axes it moves with (``j`` last, so it is read
back with unit stride along the lanes), it is evaluated once per distinct
value, in full vectors; the trade is one element written and read per
distinct value against a polynomial body of tens of instructions for each
evaluation saved.  A value that moves with every output axis, or that
serves a long row of ``j``, stays.

A value moves only where its new stage computes the same number: its
operands (let-bound locals read through) are output loop variables (and a
scan step's time) and loads whose indices read no loaded value (an index
read from memory is bounds-checked in the stage's order of statements),
from buffers the stage does not write; the tests around it, which the new
stage repeats (a load they guard stays in range), obey the same rules.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from te_autodiff.expr import Expr, logic_not
from te_autodiff.ops import is_transcendental

from ..loop_ir import (Alloc, Block, BufLoad, For, If, Local, Stage, Store, children, free_leaves, loads_in, map_stmt,
                       nodes_in, stmt_exprs, substitute, substituter, walk)
from .blocking import TILE_VECTORS, Blocking
from .constructors import linear
from .nest import Nest, accesses_of, assemble
from .vector_width import lanes_for


@dataclass(frozen=True)
class Uniform:
    """One value to move: ``node`` as the body writes it, ``value`` with its
    let-bound locals read through, ``tests`` (condition, holds) around it,
    outermost first, and the output ``axes`` it is computed over."""

    node: Expr
    value: Expr
    tests: tuple
    axes: tuple


def _visit(s, tests: tuple, lets: dict, found: dict, bad: set):
    """Record in ``found`` every transcendental node of ``s`` with the tests
    around it; a node met under two sets of tests goes to ``bad``.
    ``lets``: each let-bound local's value."""
    if isinstance(s, Block):
        for x in s.stmts:
            _visit(x, tests, lets, found, bad)
        return
    if isinstance(s, If):
        _scan(s.cond, tests, found, bad)
        _visit(s.then, tests + ((s.cond, True),), lets, found, bad)
        if s.else_ is not None:
            _visit(s.else_, tests + ((s.cond, False),), lets, found, bad)
        return
    for e in stmt_exprs(s):
        _scan(e, tests, found, bad)
    if isinstance(s, Alloc) and s.let and s.init is not None:
        lets[s.local] = s.init
    if isinstance(s, For):
        _visit(s.body, tests, lets, found, bad)


def _scan(e: Expr, tests: tuple, found: dict, bad: set):
    for x in nodes_in([e], set(), Expr):
        if is_transcendental(getattr(x, "op", None)) and found.setdefault(x, tests) != tests:
            bad.add(x)


def _movable(e: Expr, axes: set, written: set) -> bool:
    """Whether ``e`` (lets read through) reads only the variables ``axes``,
    and loads from unwritten buffers at indices that read no loaded value."""
    if not free_leaves(e) <= axes:
        return False
    return all(x.buffer not in written and next(loads_in(children(x), set()), None) is None
               for x in loads_in([e], set()))


def decide(nest: Nest, j, bl: Blocking, time=None) -> list:
    """The :class:`Uniform` values of ``nest`` (vector axis ``j``) to move:
    the movable ones evaluated more often in place (:func:`_repeated`).
    ``time``: a scan step's time variable (the new stages run in the same
    step, so a value may read it).  Of nested movable values the outermost
    moves (the stage scheduled again moves an inner one the body still
    reads)."""
    found, bad, lets = {}, set(), {}
    _visit(nest.body, (), lets, found, bad)
    if not found:
        return []
    lanes = lanes_for(accesses_of(nest.body), bl)
    written = {s.buffer for s in walk(nest.body) if isinstance(s, Store)}
    allowed = set(nest.vars) | ({time} if time is not None else set())
    expand = _expander(lets)
    movable = []
    for node, tests in found.items():
        value = expand(node)
        tests = tuple((expand(c), holds) for c, holds in tests)
        if node in bad or not all(_movable(x, allowed, written) for x in [value] + [c for c, _ in tests]):
            continue
        used = set().union(free_leaves(value), *(free_leaves(c) for c, _ in tests))
        axes = tuple(v for v in nest.vars if v in used and v is not j) + ((j,) if j in used else ())
        if axes and _repeated(nest, j, set(axes), lanes):
            movable.append(Uniform(node, value, tests, axes))
    inner = set().union(*(set(nodes_in(children(u.node), set(), Expr)) for u in movable))
    return [u for u in movable if u.node not in inner]


def _repeated(nest: Nest, j, axes: set, lanes: int) -> bool:
    """Whether a value over ``axes`` costs more evaluations in ``nest`` than
    in a stage of its own: it does not move with ``j`` and a row of ``j``
    spans less than two column tiles (:data:`~.blocking.TILE_VECTORS`
    vectors each), or it moves with ``j`` and not with another output axis
    of two or more iterations (the vector loop, inside that axis's loop,
    evaluates it again on each of its iterations).  A row that short runs
    as a tile's unrolled vectors and a remainder's, and each piece
    evaluates the value again, once per fewer elements than a tile holds;
    along a longer row the loop over its tiles evaluates it once, and the
    tiles' other work hides that evaluation."""
    if j not in axes:
        return nest.extent(j) < 2 * TILE_VECTORS * lanes
    return any(v not in axes and n >= 2 for v, n in zip(nest.vars, nest.extents))


def _expander(lets: dict):
    """``e -> e`` with let-bound locals replaced by their values (which may
    read earlier lets)."""
    done: dict = {}
    for local, init in lets.items():
        done[local] = substitute(init, done) if free_leaves(init) & done.keys() else init
    sub = substituter(done)
    return lambda e: sub(e) if any(isinstance(x, Local) for x in free_leaves(e)) else e


def build(nest: Nest, stage: Stage, values: list, temps) -> list:
    """A stage per value (named for the stage's buffer: a fused stage's name
    joins several), then ``stage`` reading them: ``[stages...]``."""
    loops = {lp.var: lp for lp in nest.loops}
    out, reads = [], {}
    for k, u in enumerate(values):
        shape = tuple(loops[v].extent.value for v in u.axes)
        buf = temps.new(f"{stage.buffer.name}.u{k}", shape, u.value.dtype)
        body = Store(buf, linear(u.axes, shape), u.value)
        for cond, holds in reversed(u.tests):
            body = If(cond if holds else logic_not(cond), Block((body,)))
        out.append(Stage(buf.name, buf, assemble([loops[v] for v in u.axes], Block((body,))), step=stage.step))
        reads[u.node] = BufLoad(buf, linear(u.axes, shape))
    sub = substituter(reads)
    body = map_stmt(nest.body, sub)
    return out + [replace(stage, body=nest.around(body))]
