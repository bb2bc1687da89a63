"""Rule 9, the parallel root: the outermost loop of a stage is the one the
runtime splits across threads, so it should have at least ``MIN_ROOT``
iterations; an output tile loop with more is moved out when it has fewer."""
from __future__ import annotations

from ..loop_ir import Block, For, stmt_exprs
from .blocking import MIN_ROOT
from .nest import assemble, depends, trips


def loop_chain(loop):
    """A tile loop nest as a list of loops whose innermost carries the body."""
    out = [loop]
    while True:
        body = out[-1].body
        if isinstance(body, Block) and len(body.stmts) == 1 and isinstance(body.stmts[0], For):
            out.append(body.stmts[0])
        else:
            return out


def choose_root(chain, movable=None):
    """Move a loop with at least MIN_ROOT iterations outermost when the
    outermost has fewer (loops over independent outputs, ``movable``, may be
    reordered freely).  Returns the loop order; the body stays the innermost's."""
    first = chain[0]
    if trips(first) >= MIN_ROOT:
        return chain
    for k, lp in enumerate(chain[1:], 1):
        if (movable is None or lp.var in movable) and trips(lp) >= MIN_ROOT and \
                not depends(stmt_exprs(lp), {x.var for x in chain[:k]}):
            return [lp] + chain[:k] + chain[k + 1:]
    return chain


def with_root(chain, body, movable=None):
    """The loops ``chain`` around ``body``, reordered for a parallel root (:func:`choose_root`)."""
    return assemble(choose_root(chain, movable), body)
