"""Loop IR: buffers, loop nests, stores and local scalars; immutable and printable.

Expressions reuse the hash-consed nodes of ``te_autodiff.expr`` (Const, Var,
BinOp, Cmp, Logic, Unary, Select, Cast) plus leaves of their own:
:class:`BufLoad` (one element of a flat buffer), :class:`Local` (a scalar
variable declared by :class:`Alloc` and written by :class:`Assign`) and
:class:`AlignGap` (how far into an input its first aligned address lies).  Loop IR
expressions are pure and cannot fault: anything that may (a guarded read, a
reduction) has been turned into statements by ``lower.py``.

``str(program)`` is the readable text shown as ``kernel.loop_ir``; with
``typed=True`` every constant carries its dtype, which makes the text a
faithful structural key (the compile cache uses it).
"""
from __future__ import annotations

from dataclasses import dataclass
from math import prod

import numpy as np

from te_autodiff.expr import BinOp, Cast, Const, Expr, Load, Reduce, Select, Var, open_affine
from te_autodiff.pretty import OPERATOR_TEXT
from te_autodiff.visit import children as te_children, trampoline

LOOP_KINDS = ("serial", "parallel", "vectorize", "rolled", "partial", "transpose")
BUFFER_KINDS = ("input", "output", "temp")
STAGE_BUDGET = 256               # expression nodes of one stage body: LLVM's compile time grows faster
                                 # than linearly with one loop body, so lowering and fusion stop here
LOOP_NEST_NODES = 32             # what a reduction computed in a stage adds to its size besides its body:
                                 # the schedule makes it a nest of tiles, K blocks and remainders


@dataclass(frozen=True, eq=False)
class Buffer:
    """A flat row-major array: a placeholder (input), an output or a temporary."""

    name: str
    shape: tuple
    dtype: str
    kind: str

    @property
    def size(self) -> int:
        return prod(self.shape)

    @property
    def itemsize(self) -> int:
        return np.dtype(self.dtype).itemsize

    @property
    def nbytes(self) -> int:
        return self.size * self.itemsize

    def __str__(self):
        return f"{self.name}: {self.dtype}[{', '.join(map(str, self.shape))}] {self.kind}"


class BufLoad(Expr):
    """``buffer[index]`` with a row-major linear ``index``."""

    __slots__ = ("buffer", "index")
    fields = ("buffer", "index")

    def _init(self):
        object.__setattr__(self, "dtype", self.buffer.dtype)

    def __repr__(self):
        return f"<BufLoad {expr_text(self)}>"


class GuardedLoad(Expr):
    """``buffer[index]`` where ``cond`` holds, else zero; never reads memory
    where ``cond`` fails, so it may be evaluated unconditionally (a masked
    load in a vector loop).  Made by ``schedule/selects.py`` from an ``If`` that
    guards a read."""

    __slots__ = ("buffer", "index", "cond")
    fields = ("buffer", "index", "cond")

    def _init(self):
        object.__setattr__(self, "dtype", self.buffer.dtype)

    def __repr__(self):
        return f"<GuardedLoad {expr_text(self)}>"


class LaneReduce(Expr):
    """Inside a :class:`Simd` loop: ``value`` of every active lane combined
    with ``op`` (add, mul, max, min) into one value, the same in all lanes
    (``identity`` stands in for inactive lanes).  Outside one: ``value``."""

    __slots__ = ("op", "value", "identity")
    fields = ("op", "value", "identity")

    def _init(self):
        object.__setattr__(self, "dtype", self.value.dtype)

    def __repr__(self):
        return f"<LaneReduce {expr_text(self)}>"


class AlignGap(Expr):
    """The elements from the start of ``buffer`` to its first address that is
    a multiple of ``bytes`` (a power of two), known at run time only: an
    input may be any numpy array (large ones start 16 bytes past a cache
    line).  A schedule starts a vector grid there so that the loads of
    whole vectors are aligned (``schedule/aligned_grid.py``)."""

    __slots__ = ("buffer", "bytes")
    fields = ("buffer", "bytes")

    def _init(self):
        object.__setattr__(self, "dtype", "int64")

    def __repr__(self):
        return f"<AlignGap {expr_text(self)}>"


class IntPower(Expr):
    """``base ** exponent`` for an integer ``exponent`` known to lie in
    ``[0, 2**bits)``, or with ``signed`` in ``(-2**bits, 2**bits)``:
    square-and-multiply over the ``bits`` low bits of ``|exponent|`` with a
    select per bit instead of a branch, so every lane of a vector does the
    same work, and ``1 / base ** |exponent|`` where the exponent is
    negative.  Made by ``powers.py`` from a ``te.power`` whose exponent is
    an integer converted to float and whose range the bounds analysis knows;
    printed ``powi(base, exponent, bits)``."""

    __slots__ = ("base", "exponent", "bits", "signed")
    fields = ("base", "exponent", "bits", "signed")

    def _init(self):
        object.__setattr__(self, "dtype", self.base.dtype)

    def __repr__(self):
        return f"<IntPower {expr_text(self)}>"


class Local(Expr):
    """A scalar local variable, unique by ``name`` within one stage."""

    __slots__ = ("name", "dtype_")
    fields = ("name", "dtype_")

    def _init(self):
        object.__setattr__(self, "dtype", self.dtype_)

    def __repr__(self):
        return f"<Local {self.name}: {self.dtype}>"


def children(e: Expr) -> tuple:
    """Sub-expressions of a loop IR expression."""
    if isinstance(e, BufLoad):
        return (e.index,)
    if isinstance(e, GuardedLoad):
        return (e.index, e.cond)
    if isinstance(e, LaneReduce):
        return (e.value,)
    if isinstance(e, AlignGap):
        return ()
    if isinstance(e, IntPower):
        return (e.base, e.exponent)
    return te_children(e)


# ----------------------------------------------------------------- statements


@dataclass(frozen=True, eq=False)
class Block:
    stmts: tuple


@dataclass(frozen=True, eq=False)
class For:
    """``for var in [lo, lo + extent)``; an extent <= 0 runs no iteration.
    ``kind``: serial; parallel (iterations independent, the runtime may split
    them across threads); vectorize (iterations independent, a hint for the
    loop vectoriser); rolled (serial, and LLVM must not unroll it: see
    ``schedule/register_tile.py``); partial (serial, and LLVM unrolls it
    ``PARTIAL_UNROLL`` times, never fully: see ``schedule/packing.py``);
    transpose (serial, inside a vector loop: its reads strided across the
    lanes and contiguous along it are loaded a vector of iterations at a
    time as rows and transposed in registers, see
    ``schedule/vector_width.py``'s ``transposed_lanes``)."""

    var: Var
    lo: Expr
    extent: Expr
    body: object
    kind: str = "serial"


@dataclass(frozen=True, eq=False)
class Simd:
    """A vector loop: ``var`` takes the values ``lo, lo + 1, ..., lo + count - 1``
    at once, one per lane of a ``lanes``-wide vector (``count <= lanes``; the
    lanes past ``count`` are inactive).  The body runs in lock-step on all
    lanes: a value that differs between lanes is a vector, loads and stores
    become vector, masked or gathered memory operations, locals declared
    inside are vectors, and an ``If`` or loop bound that differs between lanes
    runs under a lane mask.  Produced by ``schedule/`` only where the
    iterations are independent (distinct output elements)."""

    var: Var
    lo: Expr
    lanes: int
    count: Expr
    body: object


@dataclass(frozen=True, eq=False)
class Store:
    buffer: Buffer
    index: Expr
    value: Expr


@dataclass(frozen=True, eq=False)
class Prefetch:
    """A hint that ``buffer[index]`` (lane 0's element in a vector loop) will
    be read soon: its cache line is fetched while the statements after it
    run, and nothing waits for it (``llvm.prefetch``)."""

    buffer: Buffer
    index: Expr


@dataclass(frozen=True, eq=False)
class Alloc:
    """Declare ``local``, initialised to ``init`` when it is not None.  With
    ``let`` the local is a let-binding: assigned once, here, to a value the
    statements after it read several times (printed ``let t = ...``)."""

    local: Local
    init: Expr | None
    let: bool = False


@dataclass(frozen=True, eq=False)
class Assign:
    local: Local
    value: Expr


@dataclass(frozen=True, eq=False)
class If:
    cond: Expr
    then: Block
    else_: Block | None = None


@dataclass(frozen=True, eq=False)
class Check:
    """Run-time bounds check: unless ``0 <= index < extent`` record error
    ``code`` with the bad index and leave the stage."""

    index: Expr
    extent: int
    code: int
    tensor: str
    dim: int


@dataclass(frozen=True, eq=False)
class TimeLoop:
    """The loop over time of a scan: consecutive stages that share one
    ``TimeLoop`` run in order for ``var`` = ``lo ... lo + extent - 1``
    (``extent`` >= 1), reading ``var`` from the one-element buffer
    ``counter`` (the runtime sets and advances it, see ``codegen_llvm``)."""

    var: Var
    counter: Buffer
    lo: int
    extent: int


@dataclass(frozen=True, eq=False)
class Stage:
    """One materialised tensor: a loop nest whose root loop is parallel.
    A ``fixed`` stage is written by hand (``key_stages.py``): fusion and the
    schedule leave it as it is.  ``sort`` is ``(values, positions)`` for the
    counting sort of an inverse index (``te.cost`` reads it).  A stage with
    a ``step`` computes one time step of a scan, inside its time loop.  An
    ``apart`` stage was split from its neighbours to run on its own (a
    column group, ``schedule/column_groups.py``): no pass joins it to them."""

    name: str
    buffer: Buffer
    body: For
    fixed: bool = False
    sort: tuple | None = None
    step: TimeLoop | None = None
    apart: bool = False


@dataclass(frozen=True, eq=False)
class Program:
    """Buffers (inputs first, in argument order), stages in execution order,
    ``results`` (the buffer holding each requested output, possibly repeated
    or an input), and the run-time check table ``(tensor, dim, extent)``
    indexed by ``Check.code - 1``."""

    name: str
    buffers: tuple
    stages: tuple
    results: tuple
    checks: tuple

    @property
    def inputs(self) -> tuple:
        return tuple(b for b in self.buffers if b.kind == "input")

    @property
    def temp_bytes(self) -> int:
        return sum(b.nbytes for b in self.buffers if b.kind == "temp")

    def text(self, typed: bool = False) -> str:
        return _Printer(typed).program(self)

    def __str__(self):
        return self.text()


def walk(stmt):
    """Every statement in ``stmt``, parents before children."""
    stack = [stmt]
    while stack:
        s = stack.pop()
        yield s
        if isinstance(s, Block):
            stack.extend(reversed(s.stmts))
        elif isinstance(s, (For, Simd)):
            stack.append(s.body)
        elif isinstance(s, If):
            stack.extend(b for b in (s.else_, s.then) if b is not None)


_STMT_EXPRS = {
    For: lambda s: (s.lo, s.extent),
    Simd: lambda s: (s.lo, s.count),
    Store: lambda s: (s.index, s.value),
    Alloc: lambda s: () if s.init is None else (s.init,),
    Assign: lambda s: (s.value,),
    If: lambda s: (s.cond,),
    Check: lambda s: (s.index,),
    Prefetch: lambda s: (s.index,),
    Block: lambda s: (),
}


def stmt_exprs(s) -> tuple:
    """The expressions a statement evaluates itself (not those of nested statements)."""
    return _STMT_EXPRS[type(s)](s)


def _store(s, expr):
    return Store(s.buffer, expr(s.index), expr(s.value))


def map_stmt(s, expr, local=lambda x: x, kind=lambda loop: loop.kind, store=_store):
    """``s`` rebuilt with every expression it evaluates passed through ``expr``,
    every local it declares or assigns through ``local``, every loop's
    kind given by ``kind(loop)`` and every store made by ``store(s, expr)``
    (nested statements included); the one statement walker the passes share."""
    def go(x):
        return map_stmt(x, expr, local, kind, store)
    if isinstance(s, Block):
        return Block(tuple(go(x) for x in s.stmts))
    if isinstance(s, For):
        return For(s.var, expr(s.lo), expr(s.extent), go(s.body), kind(s))
    if isinstance(s, Simd):
        return Simd(s.var, expr(s.lo), s.lanes, expr(s.count), go(s.body))
    if isinstance(s, If):
        return If(expr(s.cond), go(s.then), None if s.else_ is None else go(s.else_))
    if isinstance(s, Store):
        return store(s, expr)
    if isinstance(s, Alloc):
        return Alloc(local(s.local), None if s.init is None else expr(s.init), s.let)
    if isinstance(s, Assign):
        return Assign(local(s.local), expr(s.value))
    if isinstance(s, Check):
        return Check(expr(s.index), s.extent, s.code, s.tensor, s.dim)
    if isinstance(s, Prefetch):         # a load nobody waits for: moved with the loads, gone with them
        x = expr(BufLoad(s.buffer, s.index))
        return Prefetch(x.buffer, x.index) if isinstance(x, (BufLoad, GuardedLoad)) else Block(())
    raise TypeError(f"cannot rebuild {type(s).__name__}")



def map_loops(s, fn):
    """``s`` with each outermost loop ``lp`` in it replaced by ``fn(lp)``, the
    blocks and tests around rebuilt (``fn`` decides what happens inside)."""
    if isinstance(s, Block):
        return Block(tuple(map_loops(x, fn) for x in s.stmts))
    if isinstance(s, If):
        return If(s.cond, map_loops(s.then, fn), None if s.else_ is None else map_loops(s.else_, fn))
    return fn(s) if isinstance(s, For) else s


def nodes_in(exprs, visited: set, kinds):
    """The nodes of the ``kinds`` inside ``exprs``, depth first, skipping
    nodes in ``visited`` (which it extends: pass one set to visit a shared
    sub-expression once across calls)."""
    stack = list(exprs)
    while stack:
        e = stack.pop()
        if e in visited:
            continue
        visited.add(e)
        if isinstance(e, kinds):
            yield e
        stack += children(e)


def loads_in(exprs, visited: set, kinds=(BufLoad, GuardedLoad)):
    """The buffer reads (:class:`BufLoad`, :class:`GuardedLoad`; other
    ``kinds`` of node that name a buffer) inside ``exprs``: :func:`nodes_in`."""
    return nodes_in(exprs, visited, kinds)


def stage_buffers(stage: Stage):
    """``(buffers, loaded)``: the buffers ``stage`` reads or writes, in
    first-use order (its own buffer first), and the set of those it reads."""
    seen, loaded, visited = {stage.buffer: None}, set(), set()
    if stage.step is not None:              # the time of a scan's step
        seen[stage.step.counter] = None
        loaded.add(stage.step.counter)
    for s in walk(stage.body):
        if isinstance(s, (Store, Prefetch)):    # stores (a fused stage has several) and hints name a buffer
            seen.setdefault(s.buffer, None)
        for use in loads_in(stmt_exprs(s), visited, (BufLoad, GuardedLoad, AlignGap)):
            seen.setdefault(use.buffer, None)
            if not isinstance(use, AlignGap):       # its address only
                loaded.add(use.buffer)
    return list(seen), loaded

def map_loads(e: Expr, fn) -> Expr:
    """``e`` with every buffer load ``x`` replaced by ``fn(x)`` (``None`` keeps it);
    each distinct node is visited once."""
    found = {}
    stack, seen = [e], set()
    while stack:
        x = stack.pop()
        if x in seen:
            continue
        seen.add(x)
        if isinstance(x, (BufLoad, GuardedLoad)):
            new = fn(x)
            if new is not None and new is not x:
                found[x] = new
        stack += children(x)
    return substitute(e, found) if found else e


def with_load(x, buf, index):
    """A load like ``x`` (plain or guarded) of ``buf[index]``."""
    return BufLoad(buf, index) if isinstance(x, BufLoad) else GuardedLoad(buf, index, x.cond)


def rename(s, mapping: dict):
    """Statement ``s`` with the variables and locals in ``mapping`` replaced;
    load indices (and integer expressions) simplified."""
    sub = substituter(mapping, load=lambda x: with_load(x, x.buffer, simplify_index(x.index)))

    def expr(x):
        x = sub(x)
        return simplify_index(x) if x.dtype.startswith("int") else x
    return map_stmt(s, expr, lambda x: mapping.get(x, x))

# ------------------------------------------------------------------- printing

class _Printer:
    """Indented text; every distinct variable gets a distinct name.  With
    ``slots`` (``{buffer: (name, offset)}``) buffers print as those names,
    their indices less the offset, and locals print numbered in order of
    appearance: the text of a stage as its template (``share.py``)."""

    def __init__(self, typed: bool, slots: dict | None = None):
        self.typed = typed
        self.names = {}
        self.taken = set()
        self.slots = slots
        self.locals = {}

    def access(self, buf, index) -> str:
        if self.slots is None:
            return f"{buf.name}[{self.expr(index)}]"
        name, offset = self.slots[buf]
        form = linear_form(index)
        if form is None:
            return f"{name}[{self.expr(index)}]"
        # one text for every order of the terms: the step with X[t] at t = 0
        # and the one at 2048 + ... built their sums in different orders
        terms, constant = form
        atoms = sorted(f"{k}*{self.expr(atom)}:{atom.dtype}" for atom, k in terms.items())
        return f"{name}[{' + '.join(atoms + [str(constant - offset)])}:{index.dtype}]"

    def align_gap(self, e) -> str:
        if self.slots is None:
            return f"align_gap({e.buffer.name}, {e.bytes})"
        # the slot's pointer is ``offset`` elements into the buffer: its gap differs by that much
        name, offset = self.slots[e.buffer]
        return f"align_gap({name}, {e.bytes}, past {offset % (e.bytes // e.buffer.itemsize)})"

    def local(self, x) -> str:
        if self.slots is None:
            return x.name
        return self.locals.setdefault(x, f"l{len(self.locals)}")

    def var(self, v) -> str:
        name = self.names.get(v)
        if name is None:
            name = v.name
            while name in self.taken:
                name += "'"
            self.names[v] = name
            self.taken.add(name)
        return name

    def expr(self, e, prec: int = 0) -> str:
        return trampoline(self._expr, e, prec)

    def _expr(self, e, prec: int):
        """The text of ``e`` in a context of precedence ``prec`` (a generator for
        :func:`trampoline`: each format yields ``(child, prec)`` for the text
        of a child, so deep expressions print without recursion)."""
        out = _FORMAT[type(e)](self, e)
        text, own = out if isinstance(out, tuple) else (yield from out)    # a leaf: (text, own)
        return f"({text})" if own < prec else text

    def const(self, e):
        if e.dtype == "bool":
            text = "true" if e.value else "false"
        else:
            text = repr(e.value)
        if self.typed:
            text += ":" + e.dtype
        return (f"({text})" if e.dtype != "bool" and e.value < 0 else text), 3

    def call(self, head, *args):
        """``head(args...)``, the arguments ``(child, prec)`` pairs."""
        texts = []
        for child, p in args:
            texts.append((yield child, p))
        return f"{head}({', '.join(texts)})", 3

    def stmt(self, s, depth: int) -> list:
        return _STMT_TEXT[type(s)](self, s, "  " * depth, depth)

    def for_(self, s, pad, depth):
        kind = "" if s.kind == "serial" else s.kind + " "
        head = f"{pad}{kind}for {self.var(s.var)} in {self.expr(s.lo)}..{self.expr(s.lo + s.extent)}:"
        return [head] + self.stmt(s.body, depth + 1)

    def simd(self, s, pad, depth):
        head = (f"{pad}simd[{s.lanes}] for {self.var(s.var)} in "
                f"{self.expr(s.lo)}..{self.expr(s.lo + s.count)}:")
        return [head] + self.stmt(s.body, depth + 1)

    def if_(self, s, pad, depth):
        out = [f"{pad}if {self.expr(s.cond, -1)}:"] + self.stmt(s.then, depth + 1)
        if s.else_ is not None:
            out += [f"{pad}else:"] + self.stmt(s.else_, depth + 1)
        return out

    def program(self, p: Program) -> str:
        ins = ", ".join(str(b) for b in p.inputs)
        lines = [f"kernel {p.name}({ins}):"]
        lines += [f"  {b}" for b in p.buffers if b.kind != "input"]
        loop = None
        for st in p.stages:
            if st.step is not loop and st.step is not None:
                lines.append(f"time loop {self.var(st.step.var)} in {st.step.lo}..{st.step.lo + st.step.extent}:")
            loop = st.step
            pad = "" if loop is None else "  "
            lines.append(f"{pad}stage {st.name}:")
            lines += [pad + line for line in self.stmt(st.body, 1)]
        lines.append("return " + ", ".join(b.name for b in p.results))
        return "\n".join(lines)


def _guarded_load(p, e):
    access = p.access(e.buffer, e.index)
    cond = yield e.cond, 0
    return f"{access} if {cond} else 0", -2


def _int_power(p, e):
    base = yield e.base, 0
    exponent = yield e.exponent, 0
    return f"powi({base}, {exponent}, {'±' if e.signed else ''}{e.bits} bits)", 3


def _load(p, e):
    indices = []
    for i in e.indices:
        indices.append((yield i, 0))
    return f"{e.tensor.name}[{', '.join(indices)}]", 3


_FORMAT = {
    **{node: (lambda p, e, text=text: text(e)) for node, text in OPERATOR_TEXT.items()},
    Const: _Printer.const,
    Var: lambda p, e: (p.var(e), 3),
    Select: lambda p, e: p.call("select", (e.cond, 0), (e.a, 0), (e.b, 0)),
    BufLoad: lambda p, e: (p.access(e.buffer, e.index), 3),
    LaneReduce: lambda p, e: p.call(f"{e.op}_lanes", (e.value, 0)),
    IntPower: _int_power,
    AlignGap: lambda p, e: (p.align_gap(e), 3),
    GuardedLoad: _guarded_load,
    Local: lambda p, e: (p.local(e), 3),
    Load: _load,
    Reduce: lambda p, e: p.call(f"{e.op}[{', '.join(p.var(a) for a in e.axes)}]", (e.body, 0)),
}


_STMT_TEXT = {
    Block: lambda p, s, pad, depth: [line for x in s.stmts for line in p.stmt(x, depth)],
    For: _Printer.for_,
    Simd: _Printer.simd,
    If: _Printer.if_,
    Store: lambda p, s, pad, depth: [f"{pad}{p.access(s.buffer, s.index)} = {p.expr(s.value)}"],
    Alloc: lambda p, s, pad, depth: ([f"{pad}let {p.local(s.local)} = {p.expr(s.init)}"] if s.let else
                                     [f"{pad}{p.local(s.local)}: {s.local.dtype}"
                                      + ("" if s.init is None else f" = {p.expr(s.init)}")]),
    Assign: lambda p, s, pad, depth: [f"{pad}{p.local(s.local)} = {p.expr(s.value)}"],
    Prefetch: lambda p, s, pad, depth: [f"{pad}prefetch {p.access(s.buffer, s.index)}"],
    Check: lambda p, s, pad, depth: [f"{pad}check 0 <= {p.expr(s.index)} < {s.extent}"
                                     f"  # {s.tensor} dim {s.dim}, error {s.code}"],
}


def expr_text(e: Expr) -> str:
    """One expression (loop IR or te) as text."""
    return _Printer(False).expr(e)


def stmt_text(s, typed: bool = False, slots: dict | None = None) -> str:
    """One statement as text, its variables named afresh (``slots``: see :class:`_Printer`)."""
    return "\n".join(_Printer(typed, slots).stmt(s, 0))


# ------------------------------------------------------------------- analysis


def _rebuild(e, kids):
    if isinstance(e, BufLoad):
        return e if kids[0] is e.index else BufLoad(e.buffer, kids[0])
    if isinstance(e, GuardedLoad):
        return e if kids[0] is e.index and kids[1] is e.cond else GuardedLoad(e.buffer, *kids)
    if isinstance(e, LaneReduce):
        return e if kids[0] is e.value else LaneReduce(e.op, kids[0], e.identity)
    if isinstance(e, IntPower):
        return e if kids[0] is e.base and kids[1] is e.exponent else IntPower(*kids, e.bits, e.signed)
    if isinstance(e, Select) and kids[1].dtype == kids[2].dtype == "bool":    # keep bool (te's
        if isinstance(kids[0], Const):                                        # select makes int32)
            return kids[1] if kids[0].value else kids[2]
        return Select(*kids)
    from te_autodiff.visit import rebuild
    return rebuild(e, kids)


def substituter(mapping: dict, load=None, rewrite=None):
    """A function ``e -> e`` with the variables or locals in ``mapping``
    replaced and, with ``load``, every buffer read ``x`` (its index already
    rebuilt) made ``load(x)``; with ``rewrite``, every other rebuilt
    expression ``x`` made ``rewrite(x)``.  One memo across calls, so the
    sub-expressions the statements of a stage share are visited once
    (iterative)."""
    memo = dict(mapping)

    def go(e: Expr) -> Expr:
        stack = [(e, False)]
        while stack:
            node, ready = stack.pop()
            if node in memo:
                continue
            kids = children(node)
            if ready or not kids:
                new = [memo[k] for k in kids]
                same = not isinstance(node, Select) and all(a is b for a, b in zip(new, kids))
                new = node if same else _rebuild(node, new)     # (a select may fold)
                if isinstance(new, (BufLoad, GuardedLoad)):
                    memo[node] = new if load is None else load(new)
                else:
                    memo[node] = new if rewrite is None else rewrite(new)
            else:
                stack.append((node, True))
                stack += [(k, False) for k in kids if k not in memo]
        return memo[e]
    return go


def substitute(e: Expr, mapping: dict) -> Expr:
    """``e`` with the variables or locals in ``mapping`` replaced (memoised, iterative)."""
    return substituter(mapping)(e)


def free_leaves(e: Expr) -> set:
    """The loop variables and locals ``e`` reads."""
    out, seen, stack = set(), set(), [e]
    while stack:
        node = stack.pop()
        if node in seen:
            continue
        seen.add(node)
        if isinstance(node, (Var, Local)):
            out.add(node)
        stack += children(node)
    return out


def linear_form(e: Expr):
    """``e`` as ``({atom: coefficient}, constant)`` with integer coefficients,
    where an atom is a variable or any sub-expression that is not affine
    (``i // 2``, a load, a max); ``None`` unless ``e`` is an integer expression.
    ``s * (x % c) + c * s * (x // c)`` reads as ``s * x`` (``x == c * (x // c)
    + x % c`` for floor division), so that an index into loops fused into one
    (``a.i // T``, ``a.i % T``) over a buffer laid out row after row is
    affine in the fused loop; mismatched coefficients keep both atoms."""
    if not (e.dtype.startswith("int")):
        return None
    terms, const_, stack = {}, 0, [(e, 1)]
    while stack:
        const_ += open_affine(stack, terms, casts=True)
        pair = _quotient_pair(terms)
        if pair is not None:                    # the dividend goes back in: it may be a sum
            remainder, quotient = pair
            stack.append((remainder.a, terms.pop(remainder)))
            del terms[quotient]
    return {a: c for a, c in terms.items() if c != 0}, const_


def _quotient_pair(terms: dict):
    """``(x % c, x // c)`` among ``terms`` with coefficients ``s`` and ``c * s``
    (``s`` not 0, ``c`` a positive constant), or None."""
    for atom, k in terms.items():
        if k and isinstance(atom, BinOp) and atom.op == "mod" and isinstance(atom.b, Const) and atom.b.value > 0:
            for q, kq in terms.items():
                if isinstance(q, BinOp) and q.op == "floordiv" and q.a is atom.a and q.b is atom.b \
                        and kq == k * atom.b.value:
                    return atom, q
    return None


def stride(e: Expr, v) -> int | None:
    """How much ``e`` grows when variable ``v`` grows by one (0 when ``e`` does
    not read ``v``), or ``None`` when ``e`` is not affine in ``v``."""
    form = linear_form(e)
    if form is None:
        return 0 if v not in free_leaves(e) else None
    terms, _ = form
    for atom, k in terms.items():
        if atom is not v and v in free_leaves(atom):
            return None
    return terms.get(v, 0)


def from_linear(terms: dict, constant: int, dtype: str = "int64") -> Expr:
    """The expression ``sum(k * atom) + constant`` (atoms in the given order)."""
    from te_autodiff.expr import add, const, mul
    out = None
    for atom, k in terms.items():
        term = atom if k == 1 else mul(atom, const(k, dtype))
        out = term if out is None else add(out, term)
    if out is None:
        return const(constant, dtype)
    return add(out, const(constant, dtype)) if constant else out


def simplify_index(e: Expr) -> Expr:
    """An integer index expression with its affine part collected (``(i*4 + 1)*8 + j``
    becomes ``i*32 + j + 8``), atoms in order of first appearance."""
    form = linear_form(e)
    if form is None:
        return e
    terms, constant = form
    order = [n for n in _preorder(e) if n in terms]
    out = from_linear({a: terms[a] for a in dict.fromkeys(order)}, constant, e.dtype)
    return out if out.dtype == e.dtype else Cast(e.dtype, out)     # int64(x[i]) stays int64


def _preorder(e):
    stack = [e]
    while stack:
        node = stack.pop()
        yield node
        stack += reversed(children(node))
