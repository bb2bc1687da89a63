"""Integer powers by multiplications: ``te.power(x, k)`` whose exponent is an
integer expression converted to float.

``te.power(t[i], j.astype("float64"))`` (GradBench's ``t_i^j``), the
``t^(j - 1)`` of its derivative with respect to ``t`` (``ops._minus_one``
keeps ``j - 1`` an integer) and ``x ** float(i * 4 + j)`` are products of
``|k|`` copies of ``x``.  After the schedule has fixed every loop, each is
lowered by the first of these that applies, where the bounds analysis
(``bounds_check.bounds``, then ``bounds_exact.reach`` for a non-affine
exponent) bounds ``|k|`` below ``2**MAX_BITS`` over the loops and ``If``
guards around the power:

1. **A running product** along a sequential loop ``j`` (serial, rolled,
   partial or transpose: one iteration after another) when ``k = c*j + d``
   with a constant ``c >= 1``, ``d`` and ``x`` do not change inside the loop
   (no local the loop writes, no buffer it stores, not ``j``), and the power
   is evaluated on every iteration (in a statement of the loop's own body,
   not under an ``If`` or an inner loop, and no run-time bounds check in
   the loop: ``x`` is then safe to read before the loop, which is entered
   only where it runs at least once).  Before the loop ``p = x^k0`` (``k0``:
   ``k`` at the first iteration, as (2) or (3) lowers it) and ``x^c``; each
   use reads ``p``; the last statement of the body is
   ``p = p * x^c``.  The exponent must be non-negative on the whole loop:
   at ``k < 0``, ``p = 1 / x^|k|`` is ``inf`` at ``x = 0``, and ``inf * 0``
   would poison every later iteration.  Where the bounds show ``k0 >= L``
   for a negative ``L`` (``t^(j - 1)`` at ``j = 0``), the first
   ``ceil(-L / c)`` iterations are peeled into a loop of their own that
   keeps the power (as (2) lowers it) and the product runs on the rest,
   from an exponent of at least 0.  In the primal of a polynomial
   ``sum_j x_j t_i^j`` this is the reduction over ``j``: one multiplication
   per term instead of a ``pow``.  Where ``j`` is parallel or a vector's
   lanes (the gradient ``dx_j = -sum_i r_i t_i^j`` has ``j`` as its output
   loop) nothing is carried from one iteration to the next: (2) applies.
2. :class:`~lowering.loop_ir.IntPower`, **branch-free square-and-multiply**:
   ``bits`` squarings and ``bits`` selects, the same instructions on every
   lane, so a vector loop stays a vector loop; a range that reaches below
   0 takes ``1 / x^|k|`` there.  That agrees with C99's pow at the zeros
   and infinities (``0^-n = inf``, ``(-0)^-n = -inf`` for an odd ``n``,
   ``inf^-n = 0``), and differs only where ``x^|k|`` leaves the normal
   floats while ``x^-|k|`` does not (an overflow gives 0 where pow gives a
   subnormal; a subnormal ``x^|k|`` has lost bits before the division).
3. Otherwise (an exponent read from data, or a range reaching
   ``2**MAX_BITS``) the ``pow`` body stays, about one ulp at any exponent.

Errors.  A product of ``k`` copies of ``x`` formed by any ``k - 1``
rounded multiplications has a relative error of at most about ``(k - 1)
eps`` (``eps`` = 2**-53 in float64): an error made at an intermediate
``x^a`` is raised to the power ``k / a`` with it.  The running product
adds one rounding per step, and for ``x`` near 1 those do not cancel: a
good fraction of the bound is reached (the sum the product usually sits in
has a bound of the same order).  Square-and-multiply makes only about
``2 log2 k`` roundings, but the error of its first square is raised to the
power ``k / 2``, so its bound is ``(k - 1 + log2 k) eps`` too, and in
practice it reaches more of it than the running product.  ``1 / x^|k|``
adds one rounding.  Below ``2**MAX_BITS`` both bounds stay under
``2**(MAX_BITS - 53)``; past it the pow body's one ulp is worth its cost
(a few times that of ``MAX_BITS`` squarings).
float32 powers multiply in float64 (the running product carries a float64
``p``) and round once: within half a float32 ulp plus ``(k - 1) 2**-53``.
A product that passes through the subnormals loses precision there, as
any product does (pow rounds once).
"""
from __future__ import annotations

from dataclasses import replace

from te_autodiff import dtype as dt
from te_autodiff.expr import BinOp, Cast, Const, Var, add, binop, cast, compare, const, mul, power, sub, var

from .bounds_check import Scope, bounds, is_index_only
from .bounds_exact import Reach, reach
from .loop_ir import (Alloc, Assign, Block, BufLoad, Check, For, GuardedLoad, If, IntPower, Local, Program, Simd,
                      Store, children, free_leaves, map_stmt, rename, simplify_index, stmt_exprs, stride,
                      substitute, substituter, walk)

MAX_BITS = 12          # |k| < 2**MAX_BITS by multiplications: relative error below 2**(MAX_BITS - 53)
SEQUENTIAL = ("serial", "rolled", "partial", "transpose")      # loop kinds that run one iteration after another


def integer_powers(program: Program) -> Program:
    """``program`` with its integer powers lowered (see the module doc)."""
    return replace(program, stages=tuple(replace(st, body=_Stage(st.body).run()) if _has_powers(st.body) else st
                                         for st in program.stages))


def _has_powers(body) -> bool:
    """Whether a statement of ``body`` evaluates an integer power (each shared node visited once)."""
    seen = set()
    return any(_integer_exponent(e) is not None for s in walk(body) for e in _nodes(stmt_exprs(s), seen))


def _integer_exponent(e):
    """``k`` when ``e`` is ``pow(x, float(k))`` with ``k`` an integer expression, else None."""
    if isinstance(e, BinOp) and e.op == "pow" and isinstance(e.b, Cast) and dt.is_int(e.b.a.dtype):
        return e.b.a
    return None


def _nodes(exprs, seen=None):
    """Every node of ``exprs`` once (loop IR children), none of ``seen`` (which it extends)."""
    seen, stack = set() if seen is None else seen, list(exprs)
    while stack:
        e = stack.pop()
        if e in seen:
            continue
        seen.add(e)
        yield e
        stack += children(e)


def _direct(stmt):
    """The statements of a loop body that run on every iteration: not under
    an ``If`` or inside an inner loop."""
    stack = [stmt]
    while stack:
        s = stack.pop()
        if isinstance(s, Block):
            stack.extend(reversed(s.stmts))
        elif not isinstance(s, (If, For, Simd)):
            yield s


def _range(k, scope):
    """``(lo, hi)`` of the integer ``k`` where ``scope`` holds (None ends: unknown)."""
    lo, hi = bounds(k, scope)
    if (lo is None or hi is None) and is_index_only(k) and not any(isinstance(x, Local) for x in free_leaves(k)):
        found = reach(k, scope)
        if isinstance(found, Reach):
            lo = found.lo if lo is None else max(lo, found.lo)
            hi = found.hi if hi is None else min(hi, found.hi)
    return lo, hi


class _Stage:
    """The rewrite of one stage's body; ``taken``: its local names."""

    def __init__(self, body):
        self.body = body
        self.taken = {x.local.name for x in walk(body) if isinstance(x, Alloc)}
        self.count = 0

    def run(self):
        body = self.products(self.body, Scope())
        return self.squarings(body, Scope())

    def local(self, suffix: str, dtype: str) -> Local:
        """A new local ``pwN<suffix>``, its name unused in the stage."""
        while True:
            self.count += 1
            name = f"pw{self.count}{suffix}"
            if name not in self.taken:
                self.taken.add(name)
                return Local(name, dtype)

    # ------------------------------------------------------ running products

    def products(self, s, scope):
        """``s`` with running products on its sequential loops, innermost first."""
        if isinstance(s, Block):
            return Block(tuple(self.products(x, scope) for x in s.stmts))
        if isinstance(s, If):
            return If(s.cond, self.products(s.then, scope.guarded(s.cond, True)),
                      None if s.else_ is None else self.products(s.else_, scope.guarded(s.cond, False)))
        if isinstance(s, Simd):
            return replace(s, body=self.products(s.body, scope.with_vars([s.var], [(s.lo, s.count)])))
        if isinstance(s, For):
            loop = replace(s, body=self.products(s.body, scope.with_vars([s.var], [(s.lo, s.extent)])))
            return self.carry(loop, scope) if loop.kind in SEQUENTIAL else loop
        return s

    def candidates(self, loop):
        """``[(power, x, k, c)]``: the powers ``x ** float(k)`` with
        ``k = c*j + d`` evaluated on every iteration of ``loop`` whose ``x``
        and ``d`` the loop does not change."""
        j, body = loop.var, loop.body
        inside = list(walk(body))
        if any(isinstance(x, Check) for x in inside):      # a check may guard what x reads
            return []
        written = {x.local for x in inside if isinstance(x, (Alloc, Assign))}
        stored = {x.buffer for x in inside if isinstance(x, Store)}
        found = {}
        for stmt in _direct(body):
            for e in _nodes(stmt_exprs(stmt)):
                k = _integer_exponent(e)
                if k is None or e in found:
                    continue
                c = stride(k, j)
                leaves = free_leaves(e.a) | free_leaves(k)
                loads = [x for x in _nodes([e.a, k]) if isinstance(x, (BufLoad, GuardedLoad))]
                if (c is None or c < 1 or j in free_leaves(e.a) or leaves & written
                        or any(x.buffer in stored for x in loads)):
                    continue
                found[e] = (e, e.a, k, c)
        return list(found.values())

    def carry(self, loop, scope):
        """``loop`` with a running product for each of its :meth:`candidates`
        (its first iterations peeled where an exponent may be negative)."""
        j = loop.var
        inner = scope.with_vars([j], [(loop.lo, loop.extent)])
        usable, peel = [], 0
        for found in self.candidates(loop):
            _, _, k, c = found
            low = _range(simplify_index(substitute(k, {j: loop.lo})), scope)[0]
            high = _range(k, inner)[1]
            if low is None or high is None or high.bit_length() > MAX_BITS:
                continue
            usable.append(found)
            peel = max(peel, -(low // c) if low < 0 else 0)       # ceil(-low / c) iterations with k < 0
        if not usable:
            return loop
        ext_hi = _range(loop.extent, scope)[1]
        if peel and (loop.kind == "transpose" or ext_hi is not None and peel >= ext_hi):
            return loop         # (a transposing loop runs whole vectors of iterations: no odd part)
        out = []
        if peel:
            first = binop("min", loop.extent, const(peel, loop.extent.dtype))
            fresh = {j: var(j.name, j.dom)}             # the peeled copy declares its locals afresh
            for x in walk(loop.body):
                if isinstance(x, Alloc):
                    fresh[x.local] = self.local(f".{x.local.name}", x.local.dtype)
            out.append(For(fresh[j], loop.lo, first, rename(loop.body, fresh), loop.kind))
            loop = replace(loop, lo=add(loop.lo, first), extent=sub(loop.extent, first))
        out.append(self.product_loop(loop, usable, scope))
        return out[0] if len(out) == 1 else Block(tuple(out))

    def product_loop(self, loop, usable, scope):
        j = loop.var
        before, updates, uses = [], [], {}
        for e, x, k, c in usable:
            wide = "float64"                            # float32 multiplies in float64 and rounds once
            if not isinstance(x, (Const, Local, Var)):
                base = self.local(".x", x.dtype)
                before.append(Alloc(base, x, True))
                x = base
            xw = cast(wide, x)
            k0 = simplify_index(substitute(k, {j: loop.lo}))
            if c == 1:
                step = xw
            else:
                step = self.local(".step", wide)
                before.append(Alloc(step, IntPower(xw, const(c, k.dtype), c.bit_length(), False), True))
            p = self.local("", wide)
            before.append(Alloc(p, _first_power(xw, k0)))
            updates.append(Assign(p, mul(p, step)))
            uses[e] = cast(e.dtype, p)
        sub_uses = substituter(uses)
        body = map_stmt(loop.body, sub_uses)
        new = replace(loop, body=Block((body,) + tuple(updates)))
        low = _range(loop.extent, scope)[0]
        inner = Block(tuple(before) + (new,))
        if low is not None and low >= 1:
            return inner
        return If(compare("gt", loop.extent, const(0, loop.extent.dtype)), inner)

    # ------------------------------------------------------- square-and-multiply

    def squarings(self, s, scope):
        """``s`` with each remaining integer power whose range is known made an :class:`IntPower`."""
        if isinstance(s, Block):
            return Block(tuple(self.squarings(x, scope) for x in s.stmts))
        if isinstance(s, If):
            cond = self.exprs(s.cond, scope)
            return If(cond, self.squarings(s.then, scope.guarded(s.cond, True)),
                      None if s.else_ is None else self.squarings(s.else_, scope.guarded(s.cond, False)))
        if isinstance(s, Simd):
            inner = scope.with_vars([s.var], [(s.lo, s.count)])
            return replace(s, lo=self.exprs(s.lo, scope), count=self.exprs(s.count, scope),
                           body=self.squarings(s.body, inner))
        if isinstance(s, For):
            inner = scope.with_vars([s.var], [(s.lo, s.extent)])
            return replace(s, lo=self.exprs(s.lo, scope), extent=self.exprs(s.extent, scope),
                           body=self.squarings(s.body, inner))
        return map_stmt(s, lambda e: self.exprs(e, scope))

    def exprs(self, e, scope):
        def rewrite(node):
            k = _integer_exponent(node)
            if k is None:
                return node
            lo, hi = _range(k, scope)
            if lo is None or hi is None:
                return node
            bits = max(abs(lo), abs(hi)).bit_length()
            return node if bits > MAX_BITS else IntPower(node.a, k, bits, lo < 0)
        if not any(_integer_exponent(x) is not None for x in _nodes([e])):
            return e
        return substituter({}, rewrite=rewrite)(e)


def _first_power(x, k0):
    """``x ** k0`` before a running product's loop: 1, ``x``, an :class:`IntPower`
    for a constant ``k0``, else a power that :meth:`_Stage.squarings` lowers."""
    if isinstance(k0, Const):
        n = int(k0.value)
        return const(1.0, x.dtype) if n == 0 else x if n == 1 else IntPower(x, k0, n.bit_length(), False)
    return power(x, cast(x.dtype, k0))
