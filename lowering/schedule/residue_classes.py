"""Residue classes: a test ``(a v + c) % m == 0`` on an output loop ``v``
(not the innermost) holds or fails on whole residue classes of ``v`` modulo
``m``.  Zero elimination leaves such tests on the gradient of a strided read:
for ``B[i, j] = A[2j + 1, i]``, ``dA[r, c] = H[c, (r - 1) // 2]`` where ``r``
is odd and 0 elsewhere.  Run as it is, every row tests its parity, and the
vector loop gathers under that test.

The stage becomes one stage per class ``v = m w + rho`` (``rho`` in
``0..m``), each with the test folded away and scheduled from the first rule:
in the classes where it fails the stage stores the else branch (a zero fill
of the even rows), in the others every ``(...) // m`` and ``(...) % m`` of an
index is exact, so the reads are affine (``H[c, w]``: a transposing copy the
later rules vectorise like any other).  Each class keeps the order of
operations of its elements, so the values are the same bits.

The rule applies when the test's other terms are multiples of ``m`` (only
``v`` decides it), ``m`` is at most ``MAX_RESIDUES`` (each class is a stage
the runtime starts) and ``v`` is not the innermost output loop: the rows of
each class then stay contiguous (splitting the innermost loop would make
every store strided).
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from te_autodiff.expr import BinOp, Cmp, Const, Select, Var, add, const, mul, var
from te_autodiff.visit import topo_order

from ..loop_ir import (Block, For, If, Stage, children, from_linear, linear_form, map_stmt, stmt_exprs,
                       substituter, walk)
from .constructors import flat, idx
from .nest import Nest

MAX_RESIDUES = 8


@dataclass(frozen=True)
class Residues:
    """Split output loop ``loop`` into its residue classes modulo ``m``."""

    loop: For
    m: int


def _decided_by(cond, loops: list):
    """The :class:`Residues` of a test ``x % m == 0`` (or ``!=``) that one of
    ``loops`` decides alone: ``x`` affine in variables, the loop's
    coefficient the only one that is not a multiple of ``m``."""
    if not (isinstance(cond, Cmp) and cond.op in ("eq", "ne")):
        return None
    for rem, zero in ((cond.a, cond.b), (cond.b, cond.a)):
        if not (isinstance(rem, BinOp) and rem.op == "mod" and isinstance(rem.b, Const)
                and 2 <= rem.b.value <= MAX_RESIDUES and isinstance(zero, Const) and zero.value == 0):
            continue
        form, m = linear_form(rem.a), rem.b.value
        if form is None or not all(isinstance(atom, Var) for atom in form[0]):
            continue
        deciding = [atom for atom, k in form[0].items() if k % m]
        loop = next((lp for lp in loops if deciding == [lp.var]), None)
        if loop is not None:
            return Residues(loop, m)
    return None


def _tests(body):
    """The conditions of the ``If`` statements and ``select`` expressions of ``body``."""
    for s in walk(body):
        if isinstance(s, If):
            yield s.cond
        yield from (x.cond for x in topo_order(stmt_exprs(s), children) if isinstance(x, Select))


def decide(nest: Nest):
    """The :class:`Residues` of the first test of the element body (an ``If``
    or a ``select``) that an output loop other than the innermost decides by
    its residue, with at least ``m`` iterations; None when there is none."""
    for cond in _tests(nest.body):
        found = _decided_by(cond, nest.loops[:-1])
        if found is not None and found.loop.extent.value >= found.m:
            return found
    return None


def _exact(e):
    """``x // d`` and ``x % d`` for a constant ``d > 0`` and an affine ``x``
    whose every coefficient is a multiple of ``d``: ``(d X + k) // d = X + k // d``
    and ``(d X + k) % d = k % d`` (floor division, as the loop IR's)."""
    if not (isinstance(e, BinOp) and e.op in ("floordiv", "mod") and isinstance(e.b, Const) and e.b.value > 0):
        return e
    form, d = linear_form(e.a), e.b.value
    if form is None or any(k % d for k in form[0].values()):
        return e
    terms, k = form
    if e.op == "mod":
        return const(k % d, e.dtype)
    return from_linear({atom: c // d for atom, c in terms.items()}, k // d, e.dtype)


def _fold_ifs(s):
    """``s`` with every ``If`` whose condition is a constant replaced by the branch it takes."""
    if isinstance(s, Block):
        return flat(_fold_ifs(x) for x in s.stmts)
    if isinstance(s, For):
        return For(s.var, s.lo, s.extent, _fold_ifs(s.body), s.kind)
    if isinstance(s, If):
        if isinstance(s.cond, Const):
            taken = s.then if s.cond.value else s.else_
            return Block(()) if taken is None else _fold_ifs(taken)
        return If(s.cond, _fold_ifs(s.then), None if s.else_ is None else _fold_ifs(s.else_))
    return s


def build(nest: Nest, stage: Stage, plan: Residues) -> list:
    """One stage per residue class of ``plan.loop``: ``v = m w + rho``, the
    stage's name followed by ``%m=rho``."""
    v, m, extent = plan.loop.var, plan.m, plan.loop.extent.value
    out = []
    for rho in range(m):
        w = var(f"{v.name}.w")
        expr = substituter({v: add(mul(w, idx(m)), idx(rho))}, rewrite=_exact)
        loops = [For(w, idx(0), idx((extent - rho + m - 1) // m), lp.body, lp.kind) if lp is plan.loop else lp
                 for lp in nest.loops]
        body = _fold_ifs(map_stmt(nest.body, expr))
        out.append(replace(stage, name=f"{stage.name}%{m}={rho}", body=Nest(loops, body).around(body)))
    return out
