"""Parallel root: the outermost loop of a stage is the one the runtime
splits across threads, so it should have at least ``MIN_ROOT``
iterations; an output tile loop with more is moved out when it has fewer,
unless it lies inside K blocks that blocks of rows take and the blocks
already share out evenly (two over two threads); such K blocks run
outside the untiled output loops (a convolution's taps).
A root whose iterations do not share out evenly over the target's threads
(3 over 2 keeps one thread idle a third of the time) is collapsed with the
loop inside it (3 x 3 = 9: 5 and 4), and again with the next while that
helps and the threads would still idle more than ``1 - BALANCED`` of the
time (47 over 2: one idle 2%, a GEMM's whole margin).  Iterations are
weighed by the work under them: a root over blocks whose last is ragged
(49 blocks of 6 rows of 289: the runtime's equal chunks give 150 and 139
rows) counts as unbalanced, where counted alike it looks balanced (25 and
24 blocks).  Either way each element is computed by the same
operations; only which thread computes it changes."""
from __future__ import annotations

from math import prod

from te_autodiff.expr import Const, add, floordiv, mod, var

from ..loop_ir import Block, For, rename, stmt_exprs, substitute
from .constructors import idx
from .nest import assemble, depends, trips

MIN_ROOT = 4                 # fewer root iterations than this: look for a longer parallel loop
BALANCED = 0.98              # a root whose equal chunks keep the threads at least this busy
WEIGHED_ROOT = 4096          # root iterations weighed one by one at most (more: counted alike)


def _loop_chain(loop):
    """A tile loop nest as a list of loops whose innermost carries the body."""
    out = [loop]
    while True:
        body = out[-1].body
        if isinstance(body, Block) and len(body.stmts) == 1 and isinstance(body.stmts[0], For):
            out.append(body.stmts[0])
        else:
            return out


def _choose_root(chain, movable: set, shared: set, threads: int):
    """Move a loop with at least MIN_ROOT iterations outermost when the
    outermost has fewer (loops over independent outputs, ``movable``, may be
    reordered freely), but not from inside a loop of ``shared`` (K blocks
    that blocks of rows take: the loops inside share one K block of the
    rows, which a loop moved outside would re-read once per iteration) when
    the outermost already shares out evenly over ``threads``.  When the root
    so chosen does not share out evenly (11 blocks of rows over 2 threads:
    one idles 8% of the time) and a loop further in does (4 column tiles),
    that loop goes outermost and the chosen one just inside it: each thread
    then takes whole columns of every block of rows, and the K blocks stay
    inside both.  Returns the loop order; the body stays the innermost's."""
    if trips(chain[0]) >= MIN_ROOT:
        return chain
    found = []
    for k, lp in enumerate(chain[1:], 1):
        if lp.var in shared and root_balance(chain, 1, threads) >= BALANCED:
            break
        if lp.var in movable and trips(lp) >= MIN_ROOT and \
                not depends(stmt_exprs(lp), {x.var for x in chain[:k]}):
            found.append(lp)
    if not found:
        return chain
    order = found[:1] + [lp for lp in chain if lp is not found[0]]
    even = [lp for lp in found[1:] if _even(lp, threads)]
    if not _even(found[0], threads) and even:
        order = even[:1] + [lp for lp in order if lp is not even[0]]
    return order


def _even(loop, threads: int) -> bool:
    """Whether ``loop``'s iterations, counted alike, share out evenly over ``threads``."""
    return root_balance([loop], 1, threads) >= BALANCED


def balance(work: list, threads: int) -> float:
    """How busy ``threads`` threads are when iterations of these ``work``s are
    split as the runtime splits a root: in equal contiguous chunks."""
    step = -(-len(work) // threads)
    most = max((sum(work[lo:lo + step]) for lo in range(0, len(work), step)), default=0)
    return sum(work) / (most * threads) if most > 0 else 1.0


def root_balance(chain, depth: int, threads: int) -> float:
    """:func:`balance` of ``chain``'s ``depth`` outermost loops (constant
    bounds) taken as one root, each iteration weighed by the trips of the
    loops inside, evaluated there (``min(6, 86 - 6 j.b)`` rows in the last
    block).  A root of more than ``WEIGHED_ROOT`` iterations, or one whose
    inner loops do not depend on it, counts its iterations alike."""
    outer, inner = chain[:depth], chain[depth:]
    n = prod(trips(lp) for lp in outer)
    if n > WEIGHED_ROOT or not any(depends([lp.extent], {x.var for x in outer}) for lp in inner):
        return n / (-(-n // threads) * threads) if n > 0 else 1.0
    points = [()]
    for lp in outer:
        points = [p + (lp.lo.value + v,) for p in points for v in range(trips(lp))]
    work = []
    for p in points:
        mapping = {lp.var: idx(v) for lp, v in zip(outer, p)}
        work.append(prod(trips(For(lp.var, lp.lo, substitute(lp.extent, mapping), None)) for lp in inner))
    return balance(work, threads)


def _collapsed(chain, body, movable: set, threads: int):
    """``(chain, body)`` with its two outermost loops made one, again and
    again, while the outermost alone is unbalanced over ``threads`` and the
    two together are better balanced, both with constant bounds independent
    of each other (the second reordered freely, ``movable``)."""
    while len(chain) >= 2:
        a, b = chain[0], chain[1]
        if not all(isinstance(x, Const) for x in (a.lo, a.extent, b.lo, b.extent)) or b.var not in movable:
            break
        alone = root_balance(chain, 1, threads)
        if alone >= BALANCED or root_balance(chain, 2, threads) <= alone:
            break
        q = var(f"{a.var.name}.{b.var.name}")
        mapping = {a.var: add(a.lo, floordiv(q, b.extent)), b.var: add(b.lo, mod(q, b.extent))}
        rest = [For(lp.var, substitute(lp.lo, mapping), substitute(lp.extent, mapping), None, lp.kind)
                for lp in chain[2:]]
        chain, body = [For(q, idx(0), idx(trips(a) * trips(b)), None)] + rest, rename(body, mapping)
        movable = movable | {q}
    return chain, body


def _shared_first(chain, shared: set, untiled: set):
    """``chain`` with each loop of ``shared`` (K blocks that blocks of rows
    take, constant bounds) moved out of the untiled output loops just
    around it (a convolution's taps), never past the root: every loop
    inside a K block then reads that block's slice of both operands from
    cache, where each iteration of an output loop outside it would stream
    the whole reduction again.  Each element still runs its K blocks in
    order."""
    chain = list(chain)
    for k in range(2, len(chain)):
        at = k
        while chain[k].var in shared and at > 1 and chain[at - 1].var in untiled:
            at -= 1
        chain.insert(at, chain.pop(k))
    return chain


def build(outer: list, loops, threads: int, pinned=(), shared=()):
    """The stage body: the output loops ``outer`` (outermost first) around the
    tile ``loops`` (a loop nest, or a block that stays inside ``outer``),
    reordered for a parallel root (:func:`_choose_root`; every loop may move
    but those of ``pinned``, and none out of ``shared`` under a balanced
    root), the ``shared`` loops out of the untiled ones (:func:`_shared_first`),
    and collapsed when that root is unbalanced over ``threads``."""
    chain = list(outer) + (_loop_chain(loops) if isinstance(loops, For) else [])
    body = chain[-1].body if isinstance(loops, For) else loops
    movable = {lp.var for lp in chain} - set(pinned)
    shared, untiled = set(shared), {lp.var for lp in outer}
    chain = _shared_first(_choose_root(chain, movable, shared, threads), shared, untiled)
    chain, body = _collapsed(chain, body, movable, threads)
    return assemble(chain, body)
