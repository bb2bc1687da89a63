"""Small loop-IR constructors the rules share: index constants, tests,
blocks, row-major indices and the temporaries a schedule adds."""
from __future__ import annotations

from dataclasses import dataclass
from functools import reduce

from te_autodiff import dtype as dt
from te_autodiff.expr import Const, add, compare, const, logic_and, mul

from ..loop_ir import Block, Buffer


def idx(value) -> Const:
    """An index constant."""
    return const(value, dt.INDEX)


def lt(v, n):
    """The test ``v < n`` for a constant ``n``."""
    return compare("lt", v, idx(n))


def conjunction(terms):
    """``terms[0] and terms[1] and ...``, grouped from the left."""
    return reduce(logic_and, terms)


def flat(stmts) -> Block:
    """A block of ``stmts`` with nested blocks spliced in."""
    out = []
    for x in stmts:
        out += x.stmts if isinstance(x, Block) else [x]
    return Block(tuple(out))


def as_block(s):
    return s if isinstance(s, Block) else Block((s,))


def linear(indices, shape):
    """The row-major index of ``indices`` in an array of ``shape``."""
    out, step = idx(0), 1
    for ix, n in reversed(list(zip(indices, shape))):
        out = add(out, mul(ix, idx(step)))
        step *= n
    return out


@dataclass
class Temporaries:
    """The buffer names in use (``taken``) and the temporaries the schedule has
    added so far (``made``, in the order made: the program lists them so)."""

    taken: set
    made: list

    def new(self, base: str, shape, dtype) -> Buffer:
        """A new temporary named ``base`` (or ``base1``, ``base2``... when taken)."""
        name, k = base, 1
        while name in self.taken:
            name, k = f"{base}{k}", k + 1
        self.taken.add(name)
        buf = Buffer(name, shape, dtype, "temp")
        self.made.append(buf)
        return buf
