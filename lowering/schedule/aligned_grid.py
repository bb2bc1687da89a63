"""Vector grids that start where an input's cache lines start, found at run
time.

A row load of ``W`` elements covers a line only if it starts on one.  An
input may be any numpy array, and numpy's large arrays start 16 bytes past a
line, so a grid of vectors starting at index 0 splits every load over two
lines.  That costs little when the next vector comes next (the second line
is still in L1), but much when loops over rows run inside the vector loop:
the rows, often a power of two of bytes apart, share an L1 set and evict the
second line before the next vector comes back for it, so every line is
fetched twice.

:func:`grid_shift` gives the run-time shift ``s`` (``align_gap`` in the loop
IR) that puts a loop's vectors on the lines of the one input it reads
contiguously; the rules then run whole vectors from ``lo + s`` and the
leftover iterations before and after them on their own (masked or gathered:
a vector's worth in all).  A reduction in lanes on such a grid depends on
where in a cache line the input starts: a copy of the input placed
elsewhere may give results that differ in the last bits."""
from __future__ import annotations

from te_autodiff.expr import Var, add, mod

from ..loop_ir import AlignGap, linear_form, stride
from .constructors import idx

ALIGN_MIN_VECTORS = 8        # a grid shifted onto an input's lines leaves one vector (block) in this many to
                             # gathers: shorter loops keep theirs


def grid_shift(accesses, v: Var, lo: int, width: int, line: int):
    """The shift in ``[0, width)`` (a run-time expression) such that
    iterations ``lo + s, lo + s + width, ...`` of the loop over ``v`` read the input
    that ``accesses`` read with unit stride along ``v`` from an address
    aligned to ``width`` elements.  None unless exactly one buffer is read
    (never stored) with unit stride along ``v``, it is an input, a vector
    of it is at most a cache line (``line`` bytes), and every other variable
    moves its index by whole vectors (every row of a matrix shares the
    shift: a row of 1024 float32, not of 1000)."""
    along = [a for a in accesses if stride(a.index, v) == 1]
    buffers = {a.buffer for a in along}
    if len(buffers) != 1 or any(a.store for a in along):
        return None
    buf = next(iter(buffers))
    nbytes = width * buf.itemsize
    if buf.kind != "input" or nbytes > line or nbytes & (nbytes - 1):
        return None
    phases = set()
    for a in along:
        terms, constant = linear_form(a.index)
        if any(k % width for atom, k in terms.items() if atom is not v):
            return None
        phases.add((constant + lo) % width)
    if len(phases) != 1:
        return None
    gap, phase = AlignGap(buf, nbytes), phases.pop()
    # element e is aligned when e = gap (mod width); iteration lo + t reads e = t + phase (mod width)
    return gap if phase == 0 else mod(add(gap, idx(width - phase)), idx(width))
