"""Unroll and jam: an element body repeated over the positions of a tile
(register tiles), sharing its loops and tests."""
from __future__ import annotations

from ..loop_ir import Alloc, Assign, Block, For, If, Local, free_leaves, rename, stmt_exprs, walk
from .constructors import flat


def _local_deps(body, jammed: set) -> dict:
    """For every local written in ``body``: the jammed variables its value
    depends on, through its values, conditions and loop bounds (a fixed point)."""
    deps = {}

    def of(exprs):
        out = set()
        for e in exprs:
            for leaf in free_leaves(e):
                out |= {leaf} & jammed if leaf in jammed else deps.get(leaf, set())
        return out

    while True:
        before = {k: len(v) for k, v in deps.items()}

        def visit(s, ctrl):
            if isinstance(s, Block):
                for x in s.stmts:
                    visit(x, ctrl)
            elif isinstance(s, For):
                visit(s.body, ctrl | of(stmt_exprs(s)))
            elif isinstance(s, If):
                c = ctrl | of((s.cond,))
                visit(s.then, c)
                if s.else_ is not None:
                    visit(s.else_, c)
            elif isinstance(s, (Alloc, Assign)):
                deps[s.local] = deps.get(s.local, set()) | ctrl | of(stmt_exprs(s))

        visit(body, set())
        if {k: len(v) for k, v in deps.items()} == before:
            return deps, of


class _Jam:
    """Unroll-and-jam of an element body over tile positions.  ``replicas`` are
    substitutions ``{var: expr}`` of the jammed variables, one per tile
    element.  A loop or test that reads no jammed variable stays one loop or
    test around the jammed body; any other statement is repeated once per
    distinct value of the jammed variables it depends on (a padding test
    that reads only the row runs once per row, not once per tile element),
    its locals renamed per copy."""

    def __init__(self, body, replicas, jammed: set, tag: str):
        self.replicas = replicas
        self.jammed = jammed
        self.deps, self.of = _local_deps(body, jammed)
        self.tag = tag
        self.names = {}
        self.out = self.stmt(body)

    def _stmt_deps(self, s) -> set:
        out = set()
        for x in walk(s):
            out |= self.of(stmt_exprs(x))
            if isinstance(x, (Alloc, Assign)):
                out |= self.deps.get(x.local, set())
        return out

    def _rename(self, local, rep):
        d = self.deps.get(local, set())
        if not d:
            return local
        key = (local,) + tuple(rep[v] for v in sorted(d, key=lambda v: v.name))
        if key not in self.names:
            n = sum(1 for k in self.names if k[0] is local)
            self.names[key] = Local(f"{local.name}.{self.tag}{n}", local.dtype)
        return self.names[key]

    def _copies(self, s, d):
        out, seen = [], set()
        locals_ = {x.local for x in walk(s) if isinstance(x, (Alloc, Assign))}
        for e in (e for x in walk(s) for e in stmt_exprs(x)):
            locals_ |= {leaf for leaf in free_leaves(e) if isinstance(leaf, Local)}
        order = sorted(d, key=lambda v: v.name)
        for rep in self.replicas:
            key = tuple(rep[v] for v in order)
            if key in seen:
                continue
            seen.add(key)
            mapping = {v: rep[v] for v in d}
            mapping.update({x: self._rename(x, rep) for x in locals_})
            out.append(rename(s, mapping))
        return out[0] if len(out) == 1 else Block(tuple(out))

    def stmt(self, s):
        if isinstance(s, Block):
            return flat(self.stmt(x) for x in s.stmts)
        if isinstance(s, For) and not self.of(stmt_exprs(s)):
            return For(s.var, s.lo, s.extent, self.stmt(s.body), s.kind)
        if isinstance(s, If) and not self.of(stmt_exprs(s)):
            return If(s.cond, self.stmt(s.then), None if s.else_ is None else self.stmt(s.else_))
        return self._copies(s, self._stmt_deps(s))


def jam(body, replicas, tags):
    """``body`` unrolled and jammed over ``replicas`` (substitutions of the
    same variables, one per tile position); its renamed locals are tagged
    with the next number of the counter ``tags``."""
    return _Jam(body, replicas, set(replicas[0]), f"{next(tags)}.").out
