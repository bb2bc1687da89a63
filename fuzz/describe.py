"""Program descriptions: one tree per program, rendered as te source and as PyTorch source.

A program is a few placeholders (float64 tensors; int32/int64 index tensors
with a range of values) and compute tensors whose element is a scalar
expression tree over index variables.  Every node renders itself twice:

* ``te(ctx)``: te-autodiff source, e.g. ``te.tanh(X0[o1, ((o0 + r0) // 2)])``;
* ``torch(ctx)``: PyTorch source evaluated over a broadcast grid: the
  variables of the enclosing compute and reductions are the grid's
  dimensions (``ax(lo, n, slot, rank)``: a ``torch.arange`` along dimension
  ``slot`` of a rank-``rank`` grid), a read is advanced indexing, a reduction
  reduces the trailing dimensions of its body expanded to the whole grid
  (``fuzz.torch_ops`` holds these helpers).

A read that the program may evaluate out of range (padding, a guarded key)
is clamped in torch and masked with ``torch.where``: te never evaluates it,
torch evaluates it somewhere harmless and throws the value away.

``bounds(env)`` gives, for index expressions, the smallest and largest value
at every grid point (``env`` maps variables to broadcast ``numpy`` ranges and
index tensors to their value ranges): the generator uses it to decide which
reads need a guard and which index values are valid.
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields

import numpy as np

from te_autodiff.ops import OPS

# --------------------------------------------------------------------- rendering context


@dataclass(frozen=True)
class Ctx:
    """Rendering context: the rank of the torch grid, and whether a float
    constant may be written as a bare Python literal (next to a float64
    expression it adopts that dtype, in te and in torch alike)."""
    rank: int
    literal: bool = False

    def strict(self) -> "Ctx":
        return Ctx(self.rank, False)

    def loose(self) -> "Ctx":
        return Ctx(self.rank, True)


@dataclass(frozen=True)
class Var:
    """An index variable: a compute axis (``o<d>``) or a reduce axis, over
    ``lo .. lo + extent - 1``; ``slot`` is its dimension in the torch grid."""
    name: str
    slot: int
    lo: int
    extent: int

    def grid(self, rank: int) -> np.ndarray:
        shape = [1] * rank
        shape[self.slot] = max(self.extent, 1)     # an empty batch axis is checked as one point
        return np.arange(self.lo, self.lo + max(self.extent, 1)).reshape(shape)


# --------------------------------------------------------------------- index expressions


class IExpr:
    """An integer (index) expression."""

    def variables(self) -> set:
        return set()

    def data(self) -> set:
        """Names of the index tensors read."""
        return set()


@dataclass(frozen=True)
class IVar(IExpr):
    var: Var

    def te(self, ctx):
        return self.var.name

    def torch(self, ctx):
        v = self.var
        return f"ax({v.lo}, {v.extent}, {v.slot}, {ctx.rank})"

    def bounds(self, env):
        g = env.grid(self.var)
        return g, g

    def variables(self):
        return {self.var}


@dataclass(frozen=True)
class IConst(IExpr):
    value: int

    def te(self, ctx):
        return str(self.value)

    torch = te

    def bounds(self, env):
        return np.array(self.value), np.array(self.value)


@dataclass(frozen=True)
class IBin(IExpr):
    """``a op b`` for op in ``+ - * // %``; ``//`` and ``%`` take a constant ``b`` > 0 (``*`` any
    two: a product of variables is a non-affine index)."""
    op: str
    a: IExpr
    b: IExpr

    def te(self, ctx):
        return f"({self.a.te(ctx)} {self.op} {self.b.te(ctx)})"

    def torch(self, ctx):       # torch's // and % on integer tensors floor, like te's
        return f"({self.a.torch(ctx)} {self.op} {self.b.torch(ctx)})"

    def bounds(self, env):
        alo, ahi = self.a.bounds(env)
        blo, bhi = self.b.bounds(env)
        if self.op == "+":
            return alo + blo, ahi + bhi
        if self.op == "-":
            return alo - bhi, ahi - blo
        if self.op == "*":
            corners = np.broadcast_arrays(alo * blo, alo * bhi, ahi * blo, ahi * bhi)
            return np.min(corners, axis=0), np.max(corners, axis=0)
        c = int(blo)
        if self.op == "//":                           # monotone in a
            return alo // c, ahi // c
        point = alo == ahi                            # %: exact where a is known, else 0..c-1
        return np.where(point, alo % c, 0), np.where(point, ahi % c, c - 1)

    def variables(self):
        return self.a.variables() | self.b.variables()

    def data(self):
        return self.a.data() | self.b.data()


@dataclass(frozen=True)
class IData(IExpr):
    """An element of an integer tensor (a key read from data), ``I[indices]``;
    ``clamp`` when the indices may leave the tensor (the read is then under a
    guard: te never evaluates it there, torch reads a clamped index)."""
    tensor: str
    indices: tuple
    clamp: bool = False

    def te(self, ctx):
        return f"{self.tensor}[{', '.join(i.te(ctx) for i in self.indices)}]"

    def torch(self, ctx):
        ix = ", ".join(i.torch(ctx) for i in self.indices)
        return f"cread({self.tensor}, {ix}).long()" if self.clamp else f"{self.tensor}[{ix}].long()"

    def bounds(self, env):
        lo, hi = env.values[self.tensor]
        shape = np.broadcast_shapes(*(np.shape(b) for i in self.indices for b in i.bounds(env)))
        return np.full(shape, lo), np.full(shape, hi)

    def variables(self):
        return set().union(*(i.variables() for i in self.indices))

    def data(self):
        return {self.tensor}.union(*(i.data() for i in self.indices))


# --------------------------------------------------------------------- float expressions


def walk(node):
    """``node`` and every node under it (expressions, conditions, indices), parents first."""
    yield node
    for f in fields(node):
        value = getattr(node, f.name)
        for child in value if isinstance(value, tuple) else (value,):
            if isinstance(child, (Expr, Cond, IExpr)):
                yield from walk(child)


class Expr:
    """A float64 expression."""


@dataclass(frozen=True)
class Num(Expr):
    value: float

    def te(self, ctx):
        return repr(self.value) if ctx.literal else f'te.const({self.value!r}, "float64")'

    def torch(self, ctx):
        return repr(self.value) if ctx.literal else f"f64({self.value!r})"


@dataclass(frozen=True)
class ToFloat(Expr):
    """An index expression used as a value: ``e.astype("float64")`` (no derivative)."""
    index: IExpr

    def te(self, ctx):
        return f'{self.index.te(ctx)}.astype("float64")'

    def torch(self, ctx):
        return f"({self.index.torch(ctx)}).to(torch.float64)"


@dataclass(frozen=True)
class Read(Expr):
    """``tensor[indices]``.  ``guard``: 'none' (always in range); 'box'
    (``te.if_then_else(te.all(0 <= e, e < n, ...), X[...], 0.0)``) or
    'negated' (``te.if_then_else(te.any(e < 0, e >= n, ...), 0.0, X[...])``)
    over the ``(e, n)`` pairs of ``checks`` (the indices that can leave their
    tensor, keys' indices first); 'outer' (a plain read inside a select whose
    condition keeps it in range)."""
    tensor: str
    shape: tuple
    indices: tuple
    guard: str = "none"
    checks: tuple = ()

    def te(self, ctx):
        load = f"{self.tensor}[{', '.join(i.te(ctx) for i in self.indices)}]"
        if self.guard in ("none", "outer"):
            return load
        if self.guard == "box":
            conds = ", ".join(f"{e.te(ctx)} >= 0, {e.te(ctx)} < {n}" for e, n in self.checks)
            return f"te.if_then_else(te.all({conds}), {load}, 0.0)"
        conds = ", ".join(f"{e.te(ctx)} < 0, {e.te(ctx)} >= {n}" for e, n in self.checks)
        return f"te.if_then_else(te.any({conds}), 0.0, {load})"

    def torch(self, ctx):
        ix = ", ".join(i.torch(ctx) for i in self.indices)
        if self.guard == "none":
            return f"{self.tensor}[{ix}]"
        read = f"cread({self.tensor}, {ix})"
        if self.guard == "outer":
            return read
        if self.guard == "box":
            conds = " & ".join(f"({e.torch(ctx)} >= 0) & ({e.torch(ctx)} < {n})" for e, n in self.checks)
            return f"torch.where({conds}, {read}, 0.0)"
        conds = " | ".join(f"({e.torch(ctx)} < 0) | ({e.torch(ctx)} >= {n})" for e, n in self.checks)
        return f"torch.where({conds}, 0.0, {read})"


@dataclass(frozen=True)
class Unary(Expr):
    """An operator of one operand of te's table (te_autodiff/ops.py): ``te.<name>``
    against ``torch.<name>``, or negation."""
    op: str
    a: Expr

    def te(self, ctx):
        a = self.a.te(ctx.strict())
        return f"(-{a})" if self.op == "neg" else f"te.{OPS[self.op].public}({a})"

    def torch(self, ctx):
        a = self.a.torch(ctx.strict())
        return f"(-{a})" if self.op == "neg" else f"torch.{self.op}({a})"


@dataclass(frozen=True)
class Call(Expr):
    """A function of te's table of several operands (``te.atan2``, ``te.clip``)
    against torch's function of the same name; every operand a tensor."""
    op: str
    args: tuple

    def te(self, ctx):
        return f"te.{OPS[self.op].public}({', '.join(a.te(ctx.strict()) for a in self.args)})"

    def torch(self, ctx):
        args = [a.torch(ctx.strict()) for a in self.args]
        return TORCH_CALL[self.op](*args) if self.op in TORCH_CALL else f"torch.{self.op}({', '.join(args)})"


# te's composites in torch, with te's tie rules (torch.clip's value takes its
# first operand's shape and sends a tie's gradient to x) and its zeros
# (atan2 counts a zero as +0: -0.0 + 0.0 is +0.0)
TORCH_CALL = {"clip": lambda x, lo, hi: f"minimum({hi}, maximum({lo}, {x}))",
              "atan2": lambda y, x: f"torch.atan2({y} + 0.0, {x} + 0.0)"}


# te spelling, torch spelling; an infix operator is written "(a OP b)"
BINARY = {
    "add": ("+", "+"), "sub": ("-", "-"), "mul": ("*", "*"), "div": ("/", "/"),
    "pow": ("te.power", "torch.pow"), "pow_op": ("**", "torch.pow"),
    "max": ("te.maximum", "maximum"), "min": ("te.minimum", "minimum"),
    "fdiv": ("//", "fdiv"), "fmod": ("%", "torch.remainder"),
}


def _call_or_infix(fn, a, b):
    return f"({a} {fn} {b})" if not fn[0].isalpha() else f"{fn}({a}, {b})"


@dataclass(frozen=True)
class Binary(Expr):
    op: str
    a: Expr
    b: Expr

    def _ctx(self, ctx):
        """Contexts of the operands: a constant is a literal next to an expression."""
        return (ctx.loose() if not isinstance(self.b, Num) else ctx.strict(),
                ctx.loose() if not isinstance(self.a, Num) else ctx.strict())

    def te(self, ctx):
        ca, cb = self._ctx(ctx)
        return _call_or_infix(BINARY[self.op][0], self.a.te(ca), self.b.te(cb))

    def torch(self, ctx):
        ca, cb = self._ctx(ctx)
        return _call_or_infix(BINARY[self.op][1], self.a.torch(ca), self.b.torch(cb))


@dataclass(frozen=True)
class Select(Expr):
    """``te.if_then_else(cond, a, b)`` (``te.select`` when ``alias``)."""
    cond: "Cond"
    a: Expr
    b: Expr
    alias: bool = False

    def _ctx(self, ctx):
        both = isinstance(self.a, Num) and isinstance(self.b, Num)
        return ctx.strict() if both else ctx.loose()

    def te(self, ctx):
        c = self._ctx(ctx)
        fn = "te.select" if self.alias else "te.if_then_else"
        return f"{fn}({self.cond.te(ctx)}, {self.a.te(c)}, {self.b.te(c)})"

    def torch(self, ctx):
        c = self._ctx(ctx)
        return f"torch.where({self.cond.torch(ctx)}, {self.a.torch(c)}, {self.b.torch(c)})"


IDENTITY = {"sum": 0.0, "prod": 1.0}


@dataclass(frozen=True)
class Reduce(Expr):
    """``te.<op>(body, axis=axes, where=where)``; ``lead`` are the extents of
    the grid dimensions outside it (the compute's axes, enclosing reductions')."""
    op: str
    axes: tuple
    body: Expr
    lead: tuple
    where: "Cond | None" = None

    def te(self, ctx):
        inner = Ctx(ctx.rank + len(self.axes))
        axis = self.axes[0].name if len(self.axes) == 1 else f"[{', '.join(a.name for a in self.axes)}]"
        where = f", where={self.where.te(inner)}" if self.where is not None else ""
        return f"te.{self.op}({self.body.te(inner)}, axis={axis}{where})"

    def torch(self, ctx):
        inner = Ctx(ctx.rank + len(self.axes))
        body = self.body.torch(inner)
        if self.where is not None:
            body = f"torch.where({self.where.torch(inner)}, {body}, {IDENTITY[self.op]!r})"
        return f"red({self.op!r}, {body}, {self.lead}, {tuple(a.extent for a in self.axes)})"


# --------------------------------------------------------------------- conditions


class Cond:
    pass


CMP_TE = {"lt": "<", "le": "<=", "gt": ">", "ge": ">=", "eq": "te.equal", "ne": "te.not_equal"}
CMP_TORCH = {"lt": "<", "le": "<=", "gt": ">", "ge": ">=", "eq": "==", "ne": "!="}


@dataclass(frozen=True)
class Cmp(Cond):
    """``a op b``; operands are index expressions or float expressions."""
    op: str
    a: object
    b: object

    def te(self, ctx):
        a, b = self.a.te(ctx.loose()), self.b.te(ctx.loose())
        return f"{CMP_TE[self.op]}({a}, {b})" if self.op in ("eq", "ne") else f"({a} {CMP_TE[self.op]} {b})"

    def torch(self, ctx):
        return f"({self.a.torch(ctx.loose())} {CMP_TORCH[self.op]} {self.b.torch(ctx.loose())})"


@dataclass(frozen=True)
class Logic(Cond):
    """``te.all(*conds)``, ``te.any(*conds)`` or ``te.not_(cond)``."""
    op: str
    conds: tuple

    def te(self, ctx):
        fn = {"all": "te.all", "any": "te.any", "not": "te.not_"}[self.op]
        return f"{fn}({', '.join(c.te(ctx) for c in self.conds)})"

    def torch(self, ctx):
        if self.op == "not":
            return f"torch.logical_not({self.conds[0].torch(ctx)})"
        return "(" + (" & " if self.op == "all" else " | ").join(c.torch(ctx) for c in self.conds) + ")"


# --------------------------------------------------------------------- whole programs


@dataclass
class Input:
    """A placeholder: float64 values in [-2, 2], or integers in ``values`` (inclusive)."""
    name: str
    shape: tuple
    dtype: str = "float64"
    values: tuple = (0, 0)

    @property
    def is_float(self):
        return self.dtype == "float64"


@dataclass
class Compute:
    """``name = te.compute(shape, lambda o0, ...: body)``; ``dtype`` int for an index tensor."""
    name: str
    shape: tuple
    axes: tuple
    body: object
    dtype: str = "float64"
    values: tuple = (0, 0)       # value range of an index tensor

    def reduce_axes(self):
        """The reduce axes of the body, each once (a shared reduction appears twice in the tree)."""
        return list(dict.fromkeys(a for node in walk(self.body) if isinstance(node, Reduce) for a in node.axes))


@dataclass
class Program:
    """Placeholders, computes (the last one is the output ``Y``), the float
    inputs differentiated, and the second-order step: None, ``"squares"``
    (gradient of the sum of squares of the first gradient) or ``"head"``
    (vector-Jacobian product of the first gradient with a head ``K``).  The
    gradient of a second-order step is taken with respect to ``wrt`` and ``H``."""
    seed: int
    inputs: list
    computes: list
    wrt: list
    second: str | None = None
    features: set = field(default_factory=set)

    @property
    def output(self):
        return self.computes[-1]

    def first_wrt(self):
        return self.wrt[0]

    def placeholders(self) -> list:
        """All placeholders in kernel order: the inputs, ``H``, and ``K`` for a second-order head."""
        out = [(i.name, i.shape, i.dtype) for i in self.inputs] + [("H", self.output.shape, "float64")]
        if self.second == "head":
            out.append(("K", self._input(self.first_wrt()).shape, "float64"))
        return out

    def _input(self, name):
        return next(i for i in self.inputs if i.name == name)

    def outputs(self) -> list:
        """Names of the kernel's outputs, in order (matching both sources)."""
        names = [self.output.name] + [f"d{x}" for x in self.wrt]
        if self.second:
            names += [f"dd{x}" for x in self.wrt + ["H"]]
        return names

    # ------------------------------------------------------------- te source

    def te_source(self) -> str:
        lines = ["import te_autodiff as te", ""]
        for i in self.inputs:
            lines.append(f"{i.name} = te.placeholder({i.shape}, {i.dtype!r}, {i.name!r})")
        for c in self.computes:
            for r in c.reduce_axes():
                lines.append(f"{r.name} = te.reduce_axis(({r.lo}, {r.lo + r.extent}), {r.name!r})")
            params = ", ".join(a.name for a in c.axes)
            body = c.body.te(Ctx(len(c.axes)))
            lines.append(f"{c.name} = te.compute({c.shape}, lambda {params}: {body}, name={c.name!r})")
        y, wrt = self.output.name, ", ".join(self.wrt)
        lines.append(f"H = te.placeholder({y}.shape, 'float64', 'H')")
        lines.append(f"grads = te.gradient({y}, [{wrt}], head=H)")
        if self.second == "squares":
            g = self._input(self.first_wrt())
            ix = ", ".join(f"a{d}" for d in range(len(g.shape)))
            lines.append(f"S = te.compute(grads[0].shape, lambda {ix}: grads[0][{ix}] * grads[0][{ix}], name='S')")
            lines.append(f"grads2 = te.gradient(S, [{wrt}, H])")
        elif self.second == "head":
            lines.append("K = te.placeholder(grads[0].shape, 'float64', 'K')")
            lines.append(f"grads2 = te.gradient(grads[0], [{wrt}, H], head=K)")
        names = ", ".join(n for n, _, _ in self.placeholders())
        lines.append(f"inputs = [{names}]")
        lines.append(f"outputs = [{y}, *grads{', *grads2' if self.second else ''}]")
        return "\n".join(lines) + "\n"

    # ------------------------------------------------------------- torch source

    def torch_source(self) -> str:
        names = ", ".join(n for n, _, _ in self.placeholders())
        lines = ["import torch",
                 "from fuzz.torch_ops import ax, cread, f64, fdiv, fill, grad, maximum, minimum, red",
                 "", "", f"def program({names}):"]
        for c in self.computes:
            body = c.body.torch(Ctx(len(c.axes)))
            lines.append(f"    {c.name} = fill({body}, {c.shape}, {c.dtype!r})")
        y, wrt = self.output.name, ", ".join(self.wrt)
        lines.append(f"    grads = grad({y}, [{wrt}], H, create_graph={self.second is not None})")
        if self.second == "squares":
            lines.append(f"    grads2 = grad((grads[0] * grads[0]).sum(), [{wrt}, H])")
        elif self.second == "head":
            lines.append(f"    grads2 = grad(grads[0], [{wrt}, H], K)")
        lines.append(f"    return [{y}, *grads{', *grads2' if self.second else ''}]")
        return "\n".join(lines) + "\n"

    def text(self) -> str:
        """Both sources, for a report."""
        return (f"# program seed {self.seed}; features: {', '.join(sorted(self.features))}\n"
                f"# ---- te\n{self.te_source()}# ---- torch\n{self.torch_source()}")
