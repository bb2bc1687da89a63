"""The random-program generator: ``generate(seed)`` is one :class:`~fuzz.describe.Program`.

A program is one to three float64 compute tensors over small shapes (at
most 60 elements, reductions over at most 12 points), each reading the
previous one, the placeholders and sometimes the others (shared tensors), and
the output's gradients (first order, sometimes second).  Bodies draw from
everything te offers: every intrinsic, ``+ - * /``, ``te.power``/``**``,
``te.maximum``/``minimum``, float ``//`` and ``%``, selects on index and data
conditions, sum/prod/max/min reductions anywhere in a body (nested, with
``where=``, over offset ranges), indices with strides, offsets, flips,
transposes, sums of axes (convolutions), ``//`` and ``%`` by constants and
reshapes, reads from int32/int64 index tensors (embeddings, gathers, keys
with an affine part, segment conditions, keys computed by an int compute), an
index used as a value, a batch axis that may be empty, and sub-expressions
used twice.

Forms users write and random indices rarely reach (each hid a compiler bug
from thousands of programs; ``forms.py``): one read in ``FORM_SHARE`` is a
gather under selects relating its positions (``gather:select``), a read
that leaves its tensor at one point under ``te.equal``/``te.not_equal``
guards (``guard:equal``), or a non-affine index (products, quadratic forms,
``//`` and ``%`` of them: ``index:nonaffine``) kept in range by a condition
on its variables found on the grid (``guard:nonaffine``); one output in
``ONE_SHARE`` is one element reduced by max, min or sum (``one:<op>``).

Large programs (``large.py``, one seed in ``LARGE_SHARE``, ``is_large``):
one compute with simple bodies whose extents sit on both sides of the
schedule's thresholds, read from the schedule and the target at run time
(``thresholds.py``): split reductions, vector lanes, reductions in lanes,
register tiles, K blocks, panels, packing, gather blocks, residue classes,
interior splits, the parallel root (``large:<template>``,
``large:<threshold>:below|at|above``).  ``targeted`` tells a program that
takes any of these forms.

Values stay finite by construction: every expression carries an interval
(``lo``, ``hi``) containing its values (inputs lie in [-2, 2]), and an
operation whose operand is outside its domain gets a transformed operand:
``log``/``sqrt``/a denominator/a fractional power read ``x*x + c``,
``abs(x) + c``, ``exp(s*x)`` ... (at least 1/4 away from the singularity, in
either branch of a select: torch evaluates both), ``exp`` a scaled-down
argument, and anything beyond ``LIMIT`` in magnitude goes through ``tanh``.

Reads the program may evaluate out of range get a guard ('box', 'negated',
or a select around them), decided by evaluating their indices on the whole
grid; index tensors get a value range that keeps their unguarded keys in
range (a guarded key may also take values outside it).

Every random choice comes from ``numpy.random.default_rng(seed)``: a seed
is a program (a large one for the target's thresholds: ``TE_TARGET`` or
this machine).
"""
from __future__ import annotations

import math

import numpy as np

from te_autodiff.ops import OPS, unary_names

from .describe import (IBin, IConst, IData, IVar, Binary, Call, Cmp, Compute, Input, Logic, Num, Program, Read,
                       Reduce, Select, ToFloat, Unary, Var, walk)
from .forms import Forms
from .large import Large
from .values import MAX_ELEMENTS, Env, Scope, V, hull

LIMIT = 1e3             # bound on the magnitude of every value
MAX_REDUCE = 12         # points per reduction
INPUT_RANGE = 2.0       # float inputs are uniform in [-2, 2]
LARGE_SHARE = 0.1       # programs in the large mode (large.py)
FORM_SHARE = 0.15       # reads that take a targeted form (forms.py)
ONE_SHARE = 0.08        # outputs that are one element reduced by max, min or sum


TARGETED = ("large", "gather:select", "guard:equal", "index:nonaffine", "one:")


def targeted(program: Program) -> bool:
    """Whether ``program`` takes one of the targeted forms (a large program, ``forms.py``'s)."""
    return any(f.startswith(TARGETED) for f in program.features)


def is_large(seed: int) -> bool:
    """Whether program ``seed`` is a large one (drawn apart from the program's own choices)."""
    return bool(np.random.default_rng([seed, 5]).random() < LARGE_SHARE)


class Generator(Forms, Large):
    """One program's random choices (see the module doc)."""

    def __init__(self, seed: int):
        self.rng = np.random.default_rng(seed)
        self.seed = seed
        self.large = is_large(seed)
        self.leaves = None           # in a large program: the reads a body is made of
        self.features = set()
        self.inputs = []
        self.computes = []
        self.tensor_iv = {}          # float tensor -> (lo, hi)
        self.values = {}             # index tensor -> (lo, hi) of its values, inclusive
        self.batched = set()         # tensors whose axis 0 is the batch axis
        self.reads = {}              # tensor -> number of reads
        self.names = 0
        self.batch = None
        self.pool = []               # sub-expressions of the body being generated, for reuse
        self.depths = [1, 2, 3]      # expression depths of a compute body
        self.second = None           # the second-order gradient's form, if any

    # ------------------------------------------------------------ helpers

    def chance(self, p):
        return self.rng.random() < p

    def pick(self, options, weights=None):
        if weights is None:
            return options[self.rng.integers(len(options))]
        w = np.asarray(weights, float)
        return options[self.rng.choice(len(options), p=w / w.sum())]

    def fresh(self, prefix):
        self.names += 1
        return f"{prefix}{self.names}"

    def tag(self, *names):
        self.features.update(names)

    # ------------------------------------------------------------ program

    def program(self) -> Program:
        if self.large:
            return self.large_program()
        if self.chance(0.25):
            self.batch = int(self.pick([0, 1, 2, 3], [1, 1, 2, 2]))
            self.tag("batch:empty" if self.batch == 0 else "batch")
        # a second-order gradient costs 3 to 6 times a first-order one to build:
        # such programs are smaller (two computes, shallower bodies)
        second = self.second = self.pick([None, "squares", "head"], [8, 1, 1])
        if second:
            self.tag(f"second:{second}")
        n = int(self.pick([1, 2, 3], [2, 3, 0 if second else 2]))
        self.depths = [1, 2] if second else [1, 2, 3]
        for k in range(n):
            last = k == n - 1
            one = last and self.batch is None and self.chance(ONE_SHARE)
            self.computes.append(self.compute(last, one))
        floats = [i.name for i in self.inputs if i.is_float]
        wrt = [x for x in floats if self.chance(0.8)] or floats[:1]
        wrt = list(self.rng.permutation(wrt))
        if any(c > 1 for c in self.reads.values()):
            self.tag("shared:tensor")
        if len(self.computes) > 1:
            self.tag("chain")
        return Program(self.seed, self.inputs, self.computes, [str(x) for x in wrt], second, self.features)

    def shape(self, batched):
        """A compute's shape: 1 to 3 axes of 1 to 5 points, at most MAX_ELEMENTS."""
        ndim = int(self.pick([1, 2, 3], [3, 4, 2]))
        dims = [int(self.rng.integers(1, 6)) for _ in range(ndim)]
        while math.prod(dims) > MAX_ELEMENTS:
            dims[int(np.argmax(dims))] -= 1
        return ((self.batch,) + tuple(dims[1:])) if batched else tuple(dims)

    def compute(self, last, one=False) -> Compute:
        """The next compute; with ``one``, one element reduced (``one_element``)."""
        index = len(self.computes)
        name = "Y" if last else f"T{index}"
        shape = self.pick([(), (1,), (1, 1)]) if one else self.shape(self.batch is not None)
        axes = tuple(Var(f"o{d}", d, 0, n) for d, n in enumerate(shape))
        scope = Scope(list(axes), axes[0] if self.batch is not None else None)
        self.pool = []              # sub-expressions of this body, for reuse
        depth = int(self.pick(self.depths, [2, 4, 3][:len(self.depths)]))
        body = self.one_element(scope, depth) if one else self.expr(scope, depth)
        prev = [c for c in self.computes if c.dtype == "float64"]
        if prev and not any(isinstance(n, Read) and n.tensor == prev[-1].name for n in walk(body.e)):
            other = self.read_of(prev[-1], scope)
            body = self.binary_of(self.pick(["add", "mul", "sub"]), body, other)
        if last and not any(i.is_float for i in self.inputs):       # something to differentiate
            body = self.binary_of("add", body, self.read_of(self.new_input(scope), scope))
        body = self.squash(body)
        if self.batch is not None:
            self.batched.add(name)
        self.tensor_iv[name] = (body.lo, body.hi)
        return Compute(name, shape, axes, body.e)

    # ------------------------------------------------------------ expressions

    def expr(self, scope, depth) -> V:
        if self.pool and self.chance(0.08):
            self.tag("shared:expr")
            return self.pick(self.pool)
        if depth <= 0:
            kind = self.pick(["read", "num", "index"], [10, 1, 1])
        else:
            kind = self.pick(["read", "unary", "binary", "select", "reduce"],
                             [2, 4, 4, 1.5, 2 if scope.rank < 6 else 0])
        v = getattr(self, f"gen_{kind}")(scope, depth - 1)
        v = self.squash(v)
        self.pool.append(v)
        return v

    def squash(self, v) -> V:
        """``tanh`` of a value that may exceed LIMIT, scaled down first."""
        if v.mag <= LIMIT:
            return v
        self.tag("squash")
        return V(Unary("tanh", self.scaled(v, 2.0).e), -1.0, 1.0)

    def scaled(self, v, bound) -> V:
        """``v`` times a constant that brings its magnitude under ``bound``."""
        if v.mag <= bound:
            return v
        c = 10.0 ** math.floor(math.log10(bound / v.mag))
        for m in (5.0, 2.0):
            if m * c * v.mag <= bound:
                c *= m
                break
        return V(Binary("mul", v.e, Num(c)), v.lo * c, v.hi * c)

    def gen_num(self, scope, depth) -> V:
        c = float(self.pick([0.5, -1.5, 2.0, 0.25, 3.0, -0.75]))
        return V(Num(c), c, c)

    def gen_index(self, scope, depth) -> V:
        """An index expression (or a key read from data) used as a value."""
        self.tag("int_as_value")
        free = scope.free()
        if free and not self.chance(0.3):
            v = self.pick(free)
            e = IBin("+", IBin("*", IVar(v), IConst(int(self.pick([1, 2, -1])))), IConst(int(self.rng.integers(-2, 3))))
        else:
            e = self.key_read(scope)
            if e is None:
                return self.gen_num(scope, depth)
        lo, hi = e.bounds(Env(scope.rank, self.values))
        return V(ToFloat(e), float(np.min(lo)), float(np.max(hi)))

    def gen_read(self, scope, depth) -> V:
        if self.leaves is not None:
            return self.pick(self.leaves)
        if self.chance(FORM_SHARE):
            v = self.targeted_read(scope)
            if v is not None:
                return v
        return self.read_of(self.tensor_for(scope), scope)

    def gen_unary(self, scope, depth) -> V:
        """An operator of one operand of te's table, its operand brought into
        the operator's ``domain`` (``te_autodiff/ops.py``)."""
        op = self.pick(unary_names())
        return self.unary_of(op, self.expr(scope, depth))

    def unary_of(self, op, a) -> V:
        """``op`` of ``a``, its operand brought into the operator's ``domain``."""
        self.tag(f"unary:{op}")
        a = self.into(a, OPS[op].domain)
        if op == "neg":
            return V(Unary("neg", a.e), -a.hi, -a.lo)
        return V(Unary(op, a.e), *_range(OPS[op].fold, [a]))

    def into(self, a, domain) -> V:
        """``a``, or an expression of it with values in ``domain``: scaled into
        a symmetric interval, or made at least 1/4 for a half-line."""
        lo, hi = domain
        if lo == -math.inf and hi == math.inf:
            return a
        if hi == math.inf:
            assert lo == 0.25, "a half-line domain starts at 1/4 (positive)"
            return a if a.lo >= lo else self.positive(a)
        assert lo == -hi, "a bounded domain is symmetric"
        return self.scaled(a, hi)

    def positive(self, a) -> V:
        """An expression of ``a`` whose values are at least 1/4 (a domain for log, sqrt, division, powers)."""
        kind = self.pick(["square", "abs", "exp", "sigmoid"])
        self.tag(f"positive:{kind}")
        c = float(self.pick([0.25, 0.5, 1.0]))
        if kind == "exp":
            a = self.scaled(a, 1.0)
            return V(Unary("exp", a.e), math.exp(a.lo), math.exp(a.hi))
        if kind == "sigmoid":
            return V(Binary("add", Unary("sigmoid", a.e), Num(c)), c + _sigmoid(a.lo), c + _sigmoid(a.hi))
        if kind == "abs":
            return V(Binary("add", Unary("abs", a.e), Num(c)), c, c + a.mag)
        a = self.scaled(a, 30.0)
        lo = 0.0 if a.lo <= 0 <= a.hi else min(a.lo ** 2, a.hi ** 2)
        return V(Binary("add", Binary("mul", a.e, a.e), Num(c)), c + lo, c + a.mag ** 2)

    def gen_binary(self, scope, depth) -> V:
        """An operator of two or more operands of te's table: the arithmetic
        ones made safe by :meth:`binary_of`, :meth:`power` and here; any
        other with its operands in its ``domain`` (``te_autodiff/ops.py``)."""
        op = self.pick(BINARY_OPS, [BINARY_WEIGHTS.get(op, 1) for op in BINARY_OPS])
        a = self.expr(scope, depth)
        if op == "pow":
            return self.power(a, scope, depth)
        if op in ("floordiv", "mod"):
            op = {"floordiv": "fdiv", "mod": "fmod"}[op]
            c = float(self.pick([0.5, 0.75, 1.0, 2.0]))
            self.tag(f"binary:{op}")
            if op == "fmod":
                return V(Binary("fmod", a.e, Num(c)), 0.0, c)
            return V(Binary("fdiv", a.e, Num(c)), math.floor(a.lo / c), math.floor(a.hi / c))
        if op not in ARITHMETIC:
            self.tag(f"call:{op}")
            args = [self.into(a, OPS[op].domain)] + [self.into(self.expr(scope, depth), OPS[op].domain)
                                                     for _ in range(OPS[op].arity - 1)]
            if op == "clip":
                return V(Call(op, tuple(v.e for v in args)), *hull(*args))
            if op == "atan2" and self.second and args[1].lo < 0.25 and args[1].hi > -0.25:
                # atan2's second derivative is not finite at the origin: x kept from 0
                args[1] = self.positive(args[1])
            return V(Call(op, tuple(v.e for v in args)), *_range(OPS[op].fold, args))
        b = self.gen_num(scope, depth) if self.chance(0.2) else self.expr(scope, depth)
        if self.chance(0.5):
            a, b = b, a
        if isinstance(a.e, Num) and isinstance(b.e, Num):
            b = self.expr(scope, depth)
        return self.binary_of(op, a, b)

    def binary_of(self, op, a, b) -> V:
        """``a op b`` for + - * / max min, operands made safe (a denominator away from 0, products bounded)."""
        self.tag(f"binary:{op}")
        if op == "add":
            return V(Binary(op, a.e, b.e), a.lo + b.lo, a.hi + b.hi)
        if op == "sub":
            return V(Binary(op, a.e, b.e), a.lo - b.hi, a.hi - b.lo)
        if op in ("max", "min"):
            f = max if op == "max" else min
            return V(Binary(op, a.e, b.e), f(a.lo, b.lo), f(a.hi, b.hi))
        if op == "div":
            if b.lo < 0.25 and b.hi > -0.25:
                b = self.positive(b)
            corners = [a.lo / b.lo, a.lo / b.hi, a.hi / b.lo, a.hi / b.hi]
            return V(Binary("div", a.e, b.e), min(corners), max(corners))
        if a.mag * b.mag > LIMIT:
            a, b = self.scaled(a, math.sqrt(LIMIT)), self.scaled(b, math.sqrt(LIMIT))
        corners = [a.lo * b.lo, a.lo * b.hi, a.hi * b.lo, a.hi * b.hi]
        return V(Binary("mul", a.e, b.e), min(corners), max(corners))

    def power(self, a, scope, depth) -> V:
        """``a ** b``: an integer power of anything, a fractional or negative
        power of a positive base, or a positive base to an expression."""
        op = self.pick(["pow", "pow_op"])
        kind = self.pick(["int", "frac", "expr"], [2, 2, 1.5])
        self.tag(f"pow:{kind}")
        if kind == "int":
            p = float(self.pick([2.0, 3.0]))
            a = self.scaled(a, LIMIT ** (1 / p))
            if p == 2.0:
                lo = 0.0 if a.lo <= 0 <= a.hi else min(a.lo ** 2, a.hi ** 2)
                return V(Binary(op, a.e, Num(p)), lo, a.mag ** 2)
            return V(Binary(op, a.e, Num(p)), a.lo ** 3, a.hi ** 3)
        if a.lo < 0.25:
            a = self.positive(a)
        a = self.scaled(a, 50.0) if a.hi > 50 else a
        if kind == "frac":
            p = float(self.pick([0.5, -1.0, 1.5, -0.5, 2.5]))
            b = V(Num(p), p, p)
        else:
            b = self.scaled(self.expr(scope, depth), 1.5)
        corners = [x ** y for x in (a.lo, a.hi) for y in (b.lo, b.hi)]
        return V(Binary(op, a.e, b.e), min(corners), max(corners))

    def gen_select(self, scope, depth) -> V:
        kind = self.pick(["index", "data", "key"], [3, 2, 1])
        cond = self.condition(scope, kind, depth)
        if cond is None:
            kind, cond = "index", self.condition(scope, "index", depth)
        self.tag(f"select:{kind}")
        a = self.expr(scope, depth)
        b = self.gen_num(scope, depth) if self.chance(0.5) else self.expr(scope, depth)
        alias = self.chance(0.2)
        if alias:
            self.tag("select:alias")
        return V(Select(cond, a.e, b.e, alias), *hull(a, b))

    def condition(self, scope, kind, depth):
        """A condition on the axes ('index'), on values ('data') or a key equal to an axis ('key')."""
        if kind == "data":
            v = self.expr(scope, depth)
            if isinstance(v.e, Num):
                v = self.gen_read(scope, depth)
            t = round(float(self.rng.uniform(v.lo, v.hi)) * 0.5, 3) + 0.0137
            return Cmp(self.pick(["lt", "le", "gt", "ge"]), v.e, Num(t))
        if kind == "key":
            free = [v for v in scope.free() if v.extent > 0]        # a key equal to an empty axis has no values
            if not free:
                return None
            var = self.pick(free)
            key = self.key_read(scope, values=(var.lo, var.lo + var.extent - 1))
            if key is None:
                return None
            self.tag("data:segment")
            return Cmp(self.pick(["eq", "ne"]), key, IVar(var))
        parts = [self.index_cond(scope) for _ in range(int(self.pick([1, 2], [3, 1])))]
        if len(parts) > 1:
            return Logic(self.pick(["all", "any"]), tuple(parts))
        return Logic("not", (parts[0],)) if self.chance(0.15) else parts[0]

    def index_cond(self, scope):
        """``aff op c`` or ``aff % m == r`` on the axes in scope."""
        vars_ = scope.free() or scope.vars
        aff = self.affine(vars_, nvars=int(self.pick([1, 2], [2, 1])))
        lo, hi = aff.bounds(Env(scope.rank, self.values))
        if self.chance(0.3):
            m = int(self.pick([2, 3]))
            return Cmp(self.pick(["eq", "ne"]), IBin("%", aff, IConst(m)), IConst(int(self.rng.integers(m))))
        c = int(self.rng.integers(int(np.min(lo)), int(np.max(hi)) + 1))
        return Cmp(self.pick(["lt", "le", "gt", "ge", "eq", "ne"], [3, 1, 3, 1, 1, 1]), aff, IConst(c))

    def gen_reduce(self, scope, depth, op=None) -> V:
        op = op or self.pick(["sum", "max", "min", "prod"], [4, 2, 2, 1.5])
        self.tag(f"reduce:{op}")
        if any(isinstance(v.name, str) and v.name.startswith("r") for v in scope.vars):
            self.tag("reduce:nested")
        naxes = int(self.pick([1, 2], [3, 1]))
        budget = 6 if op == "prod" else MAX_REDUCE
        axes = []
        for j in range(naxes):
            n = int(self.rng.integers(1, 5))
            while math.prod([a.extent for a in axes] + [n]) > budget:
                n -= 1
            if op in ("sum", "prod") and self.chance(0.03):
                n = 0
                self.tag("reduce:empty")
            lo = int(self.pick([0, 0, 0, 1, 2]))
            if lo:
                self.tag("reduce:offset")
            axes.append(Var(self.fresh(f"r{len(self.computes)}_"), scope.rank + j, lo, n))
        inner = Scope(scope.vars + axes, scope.batch, tuple(axes))
        outer_pool, self.pool = self.pool, []
        body = self.expr(inner, depth)
        where = None
        if op in ("sum", "prod") and self.chance(0.2):
            self.tag("reduce:where")
            where = self.index_cond(inner)
        self.pool = outer_pool
        return self.reduce_of(op, axes, body, scope, where)

    def reduce_of(self, op, axes, body, scope, where=None) -> V:
        """``op`` of ``body`` over ``axes`` (inside ``scope``), its interval from the body's."""
        lead = tuple(v.extent for v in scope.vars)
        size = math.prod(a.extent for a in axes)
        if op == "prod":
            if body.mag > 1.5:
                body = V(Unary("tanh", self.scaled(body, 2.0).e), -1.0, 1.0)
            m = body.mag ** size if size else 1.0
            lo, hi = (-m, m)
        elif op == "sum":
            lo, hi = size * body.lo, size * body.hi
            if where is not None:
                lo, hi = min(lo, 0.0), max(hi, 0.0)
        else:
            lo, hi = body.lo, body.hi
        if size == 0:
            lo = hi = {"sum": 0.0, "prod": 1.0}[op]
        return V(Reduce(op, tuple(axes), body.e, lead, where), lo, hi)

    # ------------------------------------------------------------ tensors and reads

    def tensor_for(self, scope):
        """A float tensor to read: the previous compute, another one, an input, or a new input."""
        floats = [c for c in self.computes if c.dtype == "float64"]
        inputs = [i for i in self.inputs if i.is_float and self.readable(i.name, scope)]
        options, weights = [], []
        if floats:
            options.append(floats[-1])
            weights.append(3)
        for t in floats[:-1]:
            options.append(t)
            weights.append(1)
        for t in inputs:
            options.append(t)
            weights.append(2)
        if len(inputs) < 3:
            options.append(None)
            weights.append(2 if inputs else 10)
        t = self.pick(options, weights)
        return self.new_input(scope) if t is None else t

    def readable(self, name, scope):
        return name not in self.batched or scope.batch is not None

    def new_input(self, scope) -> Input:
        """A float placeholder shaped after the scope's axes (some a little larger, for strides and padding)."""
        free = scope.free()
        batched = scope.batch is not None and self.chance(0.6)
        ndim = int(self.pick([1, 2, 3], [3, 4, 1]))
        dims = []
        for _ in range(ndim):
            base = self.pick(free).extent if free else 3
            dims.append(max(1, base + int(self.pick([0, 0, 1, 2, 3, -1]))))
        while math.prod(dims) > MAX_ELEMENTS:
            dims[int(np.argmax(dims))] -= 1
        shape = ((self.batch,) + tuple(dims[1:])) if batched else tuple(dims)
        return self.add_input(shape, batched=batched)

    def add_input(self, shape, dtype="float64", values=(0, 0), batched=False) -> Input:
        """A new placeholder: float64 (values in [-INPUT_RANGE, INPUT_RANGE]) or an index
        tensor with values ``values`` (inclusive; None: decided by its first read)."""
        x = Input(f"{'X' if dtype == 'float64' else 'I'}{len(self.inputs)}", tuple(shape), dtype, values)
        self.inputs.append(x)
        if dtype == "float64":
            self.tensor_iv[x.name] = (-INPUT_RANGE, INPUT_RANGE)
        elif values is not None:
            self.values[x.name] = values
        if batched:
            self.batched.add(x.name)
        return x

    def read_of(self, t, scope) -> V:
        """A read of ``t`` at generated indices, guarded where it can leave ``t``."""
        batched = t.name in self.batched
        if self.chance(0.12) and not batched and len(t.shape) > 1:
            indices = self.reshape_indices(t.shape, scope)
        else:
            used = set()
            indices = tuple(IVar(scope.batch) if batched and d == 0 else self.index(scope, n, used)
                            for d, n in enumerate(t.shape))
        axes_order = [next(iter(ix.variables())).slot for ix in indices
                      if isinstance(ix, IVar)]
        if axes_order != sorted(axes_order):
            self.tag("index:transpose")
        return self.guarded_read(t, indices, scope)

    def guarded_read(self, t, indices, scope) -> V:
        """``t[indices]``, with a guard ('box', 'negated' or a select around it) where it can leave ``t``."""
        self.reads[t.name] = self.reads.get(t.name, 0) + 1
        lo, hi = self.tensor_iv[t.name]
        checks = self.checks(indices, t.shape, scope)
        if not checks:
            return V(Read(t.name, t.shape, indices), lo, hi)
        guard = self.pick(["box", "negated", "outer"], [3, 2, 2])
        self.tag(f"guard:{guard}")
        lo, hi = min(lo, 0.0), max(hi, 0.0)
        if guard != "outer":
            return V(Read(t.name, t.shape, indices, guard, checks), lo, hi)
        inside = Logic("all", tuple(c for e, n in checks for c in (Cmp("ge", e, IConst(0)), Cmp("lt", e, IConst(n)))))
        read = Read(t.name, t.shape, indices, "outer", checks)
        then = read if self.chance(0.5) else Unary("tanh", read)
        alt = float(self.pick([0.0, 0.5, -1.0]))
        return V(Select(inside, then, Num(alt)), min(lo, alt), max(hi, alt))

    def checks(self, indices, shape, scope) -> tuple:
        """The ``(index, extent)`` pairs that can leave their tensor: the
        indices of keys read at clamped positions (inner keys first), then the
        read's own."""
        env = Env(scope.rank, self.values)

        def leaves(ix, n):
            ilo, ihi = ix.bounds(env)
            return np.min(ilo) < 0 or np.max(ihi) >= n

        keys = [k for ix in indices for k in walk(ix) if isinstance(k, IData) and k.clamp]
        pairs = [(ix, n) for k in reversed(keys) for ix, n in zip(k.indices, self.shape_of(k.tensor)) if leaves(ix, n)]
        pairs += [(ix, n) for ix, n in zip(indices, shape) if leaves(ix, n)]
        return tuple(dict.fromkeys(pairs))

    def index(self, scope, n, used):
        """One dimension's index, for a tensor axis of ``n`` points."""
        free = [v for v in scope.free() if v not in used] or scope.free()
        prefer = [v for v in scope.prefer if v not in used]
        kind = self.pick(["axis", "stride", "conv", "divmod", "const", "data", "wild"],
                         [8, 2, 2, 2, 1, 1.5, 1] if free else [0, 0, 0, 0, 1, 1, 0])
        if kind == "data":
            key = self.data_index(scope, n)
            if key is not None:
                return key
            kind = "const" if not free else "axis"
        self.tag(f"index:{kind}")
        if kind == "const":
            return IConst(int(self.rng.integers(n)))
        v = self.pick(prefer) if prefer and self.chance(0.7) else self.pick(free)
        used.add(v)
        if kind == "axis":
            return self.placed(v, 1, n)
        if kind == "stride":
            s = int(self.pick([2, 3, -1, -2]))
            self.tag("index:flip" if s < 0 else "index:stride")
            return self.placed(v, s, n)
        if kind == "conv":
            others = [u for u in scope.free() if u is not v]
            if not others:
                return IVar(v)
            u = self.pick(others)
            used.add(u)
            s = int(self.pick([1, 1, 2]))
            e = IBin("+", IBin("*", IVar(u), IConst(s)) if s > 1 else IVar(u), IVar(v))
            return IBin("-", e, IConst(1)) if self.chance(0.3) else e
        if kind == "divmod":
            op = self.pick(["//", "%"])
            self.tag(f"index:{'floordiv' if op == '//' else 'mod'}")
            inner = self.affine(scope.free(), nvars=int(self.pick([1, 2], [2, 1])))
            c = int(self.pick([2, 3, 4]))
            e = IBin(op, inner, IConst(c))
            if self.chance(0.3):
                e = IBin("+", e, IVar(self.pick(scope.free())))
            return e
        return self.affine(scope.free(), nvars=int(self.pick([1, 2, 3], [2, 2, 1])))

    def placed(self, v, s, n):
        """``s * v + c`` with ``c`` chosen to stay in ``0 .. n - 1`` when it can
        (sometimes one off: padding), else starting at 0."""
        ends = (s * v.lo, s * (v.lo + max(v.extent, 1) - 1))
        lo, hi = -min(ends), n - 1 - max(ends)
        c = int(self.rng.integers(lo, hi + 1)) if lo <= hi else lo
        if self.chance(0.1):
            c += int(self.pick([-1, 1]))
        e = IVar(v) if s == 1 else IBin("*", IVar(v), IConst(s))
        return IBin("+", e, IConst(c)) if c else e

    def affine(self, vars_, nvars):
        """``Σ c_v * v + offset`` over ``nvars`` of ``vars_``."""
        chosen = [vars_[k] for k in self.rng.permutation(len(vars_))[:nvars]]
        e = None
        for v in chosen:
            c = int(self.pick([1, 1, -1, 2, -2, 3]))
            term = IVar(v) if c == 1 else IBin("*", IVar(v), IConst(c))
            e = term if e is None else IBin("+", e, term)
        offset = int(self.rng.integers(-3, 7))
        if e is None:
            return IConst(offset)
        return IBin("+", e, IConst(offset)) if offset else e

    def reshape_indices(self, shape, scope):
        """``X`` read as if flattened: ``f = Σ v * stride`` over some axes, then
        ``X[f // (n1 n2) % n0, f // n2 % n1, f % n2]``."""
        self.tag("index:reshape")
        free = scope.free()
        chosen = [free[k] for k in self.rng.permutation(len(free))[:int(self.pick([1, 2, 3]))]]
        f, stride = None, 1
        for v in reversed(chosen):
            term = IBin("-", IVar(v), IConst(v.lo)) if v.lo else IVar(v)
            term = IBin("*", term, IConst(stride)) if stride > 1 else term
            f = term if f is None else IBin("+", term, f)
            stride *= max(v.extent, 1)
        f = IConst(0) if f is None else f
        out = []
        for d, n in enumerate(shape):
            inner = math.prod(shape[d + 1:])
            e = IBin("//", f, IConst(inner)) if inner > 1 else f
            out.append(IBin("%", e, IConst(n)) if d else e)
        return tuple(out)

    # ------------------------------------------------------------ index tensors

    def int_tensor(self, scope):
        """An index tensor readable from the scope with in-range indices: an
        existing one, a new int32/int64 placeholder over some of the axes, or
        an int compute of one (``(I * a + b) % m``)."""
        free = scope.free()
        fitting = [t for t in self.inputs + self.computes
                   if t.dtype != "float64" and self.readable(t.name, scope)]
        if fitting and self.chance(0.6):
            return self.pick(fitting)
        free = [v for v in free if v.extent > 0]
        if not free:
            return None
        chosen = [free[k] for k in sorted(self.rng.permutation(len(free))[:int(self.pick([1, 2], [2, 1]))])]
        batched = scope.batch is not None and self.chance(0.5)
        shape = ((self.batch,) if batched else ()) + tuple(v.lo + v.extent for v in chosen)
        return self.add_input(shape, self.pick(["int32", "int64"]), None, batched)

    def shape_of(self, name):
        return next(t.shape for t in self.inputs + self.computes if t.name == name)

    def key_read(self, scope, values=None):
        """``I[axes]``: a key read at in-range indices, for a condition or a
        value; ``values`` fixes the range of a new tensor's values."""
        t = self.int_tensor(scope)
        if t is None:
            return None
        if t.values is None:
            t.values = values or (0, int(self.rng.integers(2, 6)))
            self.values[t.name] = t.values
        return self.key_read_of(t, scope, computed=values is None)

    def int_compute(self, src, scope):
        """``J = (I * a + b) % m``: a key computed from another (values ``0 .. m - 1``)."""
        lo, hi = src.values
        m = max(1, hi - lo + 1 - int(self.rng.integers(0, 2)))
        a, b = int(self.pick([1, 2, 3])), int(self.rng.integers(0, 4))
        axes = tuple(Var(f"o{d}", d, 0, n) for d, n in enumerate(src.shape))
        body = IBin("%", IBin("+", IBin("*", IData(src.name, tuple(IVar(v) for v in axes)), IConst(a)),
                              IConst(b)), IConst(m))
        j = Compute(self.fresh("J"), src.shape, axes, body, src.dtype, (0, m - 1))
        self.computes.append(j)
        self.values[j.name] = (0, m - 1)
        if src.name in self.batched:
            self.batched.add(j.name)
        self.tag("data:int_compute")
        return j

    def data_index(self, scope, n):
        """``s * I[...] + aff``: a key read from data plus an affine part; the
        key tensor's values keep it in ``0 .. n - 1``, or a guard does."""
        t = self.int_tensor(scope)
        if t is None:
            return None
        s = int(self.pick([1, 1, 1, 2]))
        free = scope.free()
        aff = IConst(0)
        if free and self.chance(0.4):
            v = self.pick(free)
            aff = IBin("*", IVar(v), IConst(int(self.pick([1, 2]))))
        alo, ahi = aff.bounds(Env(scope.rank, self.values))
        amin, amax = int(np.min(alo)), int(np.max(ahi))
        vlo, vhi = -(amin // s) if amin < 0 else 0, (n - 1 - amax) // s
        if t.values is None:
            values = (vlo, vhi) if vlo <= vhi else (0, max(n - 1, 0))
            if self.chance(0.2):
                values = (values[0] - 2, values[1] + 2)       # keys out of range: the read is guarded
            t.values = values
            self.values[t.name] = values
        key = self.key_read_of(t, scope, nest=True)
        self.tag("index:data")
        if len(t.shape) > 1:
            self.tag("data:gather")
        e = key if s == 1 else IBin("*", key, IConst(s))
        return e if isinstance(aff, IConst) else IBin("+", e, aff)

    def key_read_of(self, t, scope, computed=True, nest=False):
        """``t[axes]`` (the batch axis first if ``t`` has one), sometimes
        through an int compute of ``t`` when ``computed``.  With ``nest`` an
        index may leave ``t`` (an axis shifted or strided: the read is then
        clamped and guarded) or be a key itself (``J[I[n]]``)."""
        if computed and isinstance(t, Input) and self.chance(0.25):
            t = self.int_compute(t, scope)
        batched = t.name in self.batched
        free = scope.free()
        idx = []
        for d, n in enumerate(t.shape):
            if batched and d == 0:
                idx.append(IVar(scope.batch))
            elif nest and free and self.chance(0.25):
                self.tag("data:shifted_key")
                e = self.placed(self.pick(free), int(self.pick([1, 1, 2, -1])), n)
                idx.append(IBin("+", e, IConst(int(self.pick([-1, 1])))) if self.chance(0.5) else e)
            elif nest and self.chance(0.12) and (inner := self.int_tensor(scope)) is not None and inner is not t:
                self.tag("data:nested_key")
                if inner.values is None:
                    inner.values = self.values[inner.name] = (0, n - 1 + int(self.pick([0, 0, 1])))
                idx.append(self.key_read_of(inner, scope, computed=False))
            else:
                v = self.pick([u for u in free if 0 <= u.lo and u.lo + u.extent <= n] or [None])
                idx.append(IConst(0) if v is None else IVar(v))
        self.reads[t.name] = self.reads.get(t.name, 0) + 1
        env = Env(scope.rank, self.values)
        bounds = [(i.bounds(env), n) for i, n in zip(idx, t.shape)]
        clamp = any(np.min(lo) < 0 or np.max(hi) >= n for (lo, hi), n in bounds)
        return IData(t.name, tuple(idx), clamp)


def _sigmoid(x):
    return 1.0 / (1.0 + math.exp(min(-x, 700.0)))      # exp(709.8) overflows; sigmoid(-700) is 1e-304


def _range(f, args, points=65) -> tuple:
    """An interval containing ``f`` over the box of the intervals ``args``:
    its extremes on a grid of ``points`` per operand, widened by 2% of the
    spread (a function that turns between grid points, sin, stays inside)."""
    grids = np.meshgrid(*[np.linspace(v.lo, v.hi, points if len(args) == 1 else 17) for v in args])
    values = [f(*p) for p in zip(*(g.ravel() for g in grids))]
    values = [v for v in values if v is not None and math.isfinite(v)]
    lo, hi = min(values), max(values)
    pad = 0.02 * (hi - lo)
    return lo - pad, hi + pad


# the table's operators (te_autodiff/ops.py) the fuzzer draws, and how often
ARITHMETIC = ("add", "sub", "mul", "div", "max", "min")
BINARY_OPS = [op.name for op in OPS.values() if op.arity >= 2]
BINARY_WEIGHTS = {"add": 3, "sub": 2, "mul": 3, "div": 2, "pow": 2, "max": 1.5, "min": 1.5, "floordiv": 0.5,
                  "mod": 0.7}


def generate(seed: int) -> Program:
    """The program of ``seed``."""
    return Generator(seed).program()
