"""Large programs: extents on both sides of the schedule's thresholds.

The random programs' tensors hold at most 60 elements, below every
threshold at which the schedule (``lowering/schedule``) changes its plan.
A large program (``programs.is_large``: one seed in ``LARGE_SHARE``) is one
compute ``Y`` made by a *template*: its extents sit one below, at or one
above a threshold read from the schedule and the target at run time
(``thresholds.py``), and its reads of new inputs have the access pattern the
rule looks for.  Around those reads the body is a random expression of
depth 0 to 2 whose leaves are the template's reads (``Generator.leaves``),
so intrinsics, selects, keys and small reductions still appear; grids past
``GRID_BUDGET`` points take depth 0 (a read, a number or an index).  Large
programs have no batch axis and no second-order step, and every float input
is differentiated.

Tags: ``large:<template>``, and ``large:<threshold>:below|at|above`` for
the threshold it straddles (``large:split:below|at|prime|outer``);
``large:batched`` for a batched GEMM.
Templates, with ``T`` the thresholds:

* ``split`` (split_reduction): a sum, max or min into shape (), (1,) or (1, 1)
  (also tagged ``one:<op>``) over fewer than ``T.split_min_work`` points
  with an outer extent a multiple of a part count (``below``: not split),
  at least that many with such an outer extent (``at``: split), a prime
  above it (``prime``) or two axes whose outer extent no part count divides
  (``outer``: not split);
* ``vector`` (vector_axis): an elementwise body over rows of about ``T.lanes``
  or ``T.tile_vectors * T.lanes`` (``tile_width``) points;
* ``lane_reduction`` (lane_reduction, aligned_grid): row reductions of about ``T.lanes``
  (``reduce_lanes``), ``T.align_min_vectors * T.lanes`` (``align``) or
  ``8 * T.sum_run * T.lanes`` (``sum_run``) points, sometimes with a loop
  over rows inside;
* ``gemm`` (register_tile, panels, packing, k_blocks, row_blocks): ``Σ_k a(A[i, k]) * b(B[k, j])`` (or a max,
  min), either operand sometimes transposed, sometimes batched (``Y[b, i, j]``
  of ``A[b, i, k]``, ``B[b, k, j]``: copies hold the whole batch; tagged
  ``large:batched``), with ``k`` about
  ``T.gemm_min_trips`` (``gemm_trips``), ``T.k_block_min`` (``k_block``, ``B``
  read in place) or ``T.k_block_panel_min`` with ``B`` a panel
  (``k_block_panel``), ``i`` about
  ``T.tile_rows`` (``tile_rows``), ``B`` about ``T.panel_elements``
  (``panel``), ``i`` about ``T.pack_min_reuse`` with ``B[j, k]``
  (``pack_reuse``), ``A`` about ``T.row_block_elements`` (``row_block``);
* ``transpose`` (gather_blocks, vector_width): ``Y[i, j]`` of ``X[j, i]``, ``i`` about
  ``T.gather_block // 2`` (``gather_half``) or ``T.gather_block``
  (``gather_block``); ``j`` about ``T.l1_lines`` over ``2 *
  T.transpose_blocks`` blocks (``transpose_blocks``); ``i`` about
  ``T.align_min_vectors * T.gather_block`` past ``T.l1_lines`` columns
  (``align_blocks``); rows of ``X`` about ``T.way_elements`` (``l1_ways``);
* ``residues`` (residue_classes): ``X[m i + c, j]`` for ``m`` about
  ``T.max_residues`` (``residues``), or 2;
* ``stencil`` (interior_split): padded taps ``X[i, j - R] ... X[i, j +
  R]`` along rows of about 1, 2 or 4 aligned blocks of ``T.line``
  (``interior``) or about ``3 T.line + R``, the shortest rows split
  (``interior_ends``), as adds or as a sum over taps;
* ``root`` (parallel_root): about ``T.min_root`` rows of wide rows
  (``min_root``) or about ``T.weighed_root`` narrow ones (``weighed_root``);
* ``chains`` (vector_width): one or two functions with an inline vector
  body applied in turn to a read, rows of about ``T.lanes`` times half
  ``T.math_chains`` or ``T.math_chains`` points (``chains1``, ``chains2``);
* ``row_peel`` (row_peeling): a padded convolution ``Σ_{d, c} X[b, i + d -
  R, c] W[d, c, j]`` whose row interior (``0 <= i + d - R < H`` for every
  tap) is about ``T.tile_rows`` rows (``row_peel``);
* ``nested`` (fuse's reduction into a reduction, transposed_copies,
  vector_width): ``op_j Σ_e f(A[i, e], B[j, e])``, ``f`` one expression of
  both reads (computed inside the outer reduction) or a product of one
  expression of each (a contraction: a stage of its own), ``j`` about
  ``T.pack_min_reuse`` (``loop_reuse``: ``A`` is copied transposed from
  there), rows about one, or half ``T.math_chains``, vectors;
* ``sums`` (sum_chains): ``Σ_r a(A[r]) * b(B[r, j])`` over one vector of
  ``j`` (or up to four rows of them: no register tile), ``r`` about
  ``T.accumulators`` (``accumulators``) or past it with steps left over,
  sometimes a loop around ``r`` in the sum.
"""
from __future__ import annotations

import math
from itertools import count

from .describe import IBin, IConst, IVar, Compute, Program, Read, Var, walk
from .thresholds import thresholds
from .values import Scope, V, plus

TEMPLATES = {"split": 3, "vector": 2, "lane_reduction": 3, "gemm": 4, "transpose": 3, "residues": 1.5,
             "stencil": 1.5, "root": 1.5, "chains": 1.5, "row_peel": 1.5, "nested": 2, "sums": 1.5}
# the thresholds straddled (large:<name>:below|at|above), by template; the split's sides are its own
STRADDLED = {"vector": ("vector", "tile_width"), "lane_reduction": ("reduce_lanes", "align", "sum_run"),
             "gemm": ("gemm_trips", "k_block", "k_block_panel", "tile_rows", "panel", "pack_reuse", "row_block"),
             "transpose": ("gather_half", "gather_block", "transpose_blocks", "align_blocks", "l1_ways"),
             "residues": ("residues",), "stencil": ("interior", "interior_ends"), "root": ("min_root", "weighed_root"),
             "chains": ("chains1", "chains2"), "row_peel": ("row_peel",), "nested": ("loop_reuse",),
             "sums": ("accumulators",)}
SPLIT_SIDES = ("below", "at", "prime", "outer")
SIDES = {"below": -1, "at": 0, "above": 1}
# every tag of the large programs (the tests check that each is generated)
FEATURES = frozenset({"large", "large:batched"} | {f"large:{t}" for t in TEMPLATES}
                     | {f"large:split:{s}" for s in SPLIT_SIDES}
                     | {f"large:{name}:{side}" for names in STRADDLED.values() for name in names for side in SIDES})
GRID_BUDGET = 1 << 18       # grid points past which a body is one leaf (torch materialises the grid)


def _next_prime(n: int) -> int:
    return next(p for p in count(n + 1) if all(p % d for d in range(2, math.isqrt(p) + 1)))


class Large:
    """The large programs, a part of :class:`~fuzz.programs.Generator`."""

    def large_program(self) -> Program:
        template = self.pick(list(TEMPLATES), list(TEMPLATES.values()))
        self.tag("large", f"large:{template}")
        self.computes.append(getattr(self, f"large_{template}")(thresholds()))
        floats = [i.name for i in self.inputs if i.is_float]
        return Program(self.seed, self.inputs, self.computes, floats, None, self.features)

    # ------------------------------------------------------------ helpers

    def straddle(self, name, n, least=1) -> int:
        """``n - 1``, ``n`` or ``n + 1`` (at least ``least``), tagged ``large:<name>:below|at|above``."""
        assert any(name in names for names in STRADDLED.values()), name
        side = self.pick(list(SIDES))
        self.tag(f"large:{name}:{side}")
        return max(least, n + SIDES[side])

    def output(self, shape, body) -> Compute:
        """``Y`` of ``shape``, its element ``body(scope, axes)``."""
        axes = tuple(Var(f"o{d}", d, 0, n) for d, n in enumerate(shape))
        self.pool = []
        v = self.squash(body(Scope(list(axes), None), axes))
        self.tensor_iv["Y"] = (v.lo, v.hi)
        return Compute("Y", tuple(shape), axes, v.e)

    def leaf(self, scope, *axes) -> V:
        """A new input read at ``axes`` (its shape their ends), e.g. ``X[j, i]``."""
        x = self.add_input(tuple(a.lo + a.extent for a in axes))
        return self.guarded_read(x, tuple(IVar(a) for a in axes), scope)

    def body_over(self, leaves, scope) -> V:
        """A random expression of ``leaves`` in ``scope`` that reads the first
        (the template's access pattern); of depth 0 (a leaf, a number or an
        index) when the scope's grid is past ``GRID_BUDGET``."""
        grid = math.prod(v.extent for v in scope.vars)
        self.leaves = leaves
        v = self.expr(scope, int(self.pick([0, 1, 2], [2, 3, 1])) if grid <= GRID_BUDGET else 0)
        self.leaves = None
        if not any(isinstance(n, Read) for n in walk(v.e)):
            return leaves[0]
        if leaves[0].e not in walk(v.e):
            return self.binary_of(self.pick(["add", "sub", "mul"]), v, leaves[0])
        return v

    def reduced(self, scope, op, extents, body) -> V:
        """``op`` over new axes of ``extents`` of ``body(inner scope, axes)``."""
        axes = [Var(self.fresh(f"r{len(self.computes)}_"), scope.rank + j, 0, n) for j, n in enumerate(extents)]
        inner = Scope(scope.vars + axes, None, tuple(axes))
        outer_pool, self.pool = self.pool, []
        v = body(inner, axes)
        self.pool = outer_pool
        self.tag(f"reduce:{op}")
        return self.reduce_of(op, axes, v, scope)

    def plus_outer(self, v, scope, leaves) -> V:
        """``v`` plus (sometimes) an elementwise term over ``leaves`` of the output's axes."""
        if not self.chance(0.3):
            return v
        return self.binary_of(self.pick(["add", "mul"]), v, self.body_over(leaves, scope))

    # ------------------------------------------------------------ templates

    def large_split(self, T) -> Compute:
        S, p = T.split_min_work, int(self.pick(T.split_parts))
        q = next(k for k in count(3) if all(k % part for part in T.split_parts))
        side = self.pick(list(SPLIT_SIDES))
        self.tag(f"large:split:{side}")
        extents = self.pick({"below": [((S - 1) // p * p,), (p, (S - 1) // p)],
                             "at": [(-(-S // p) * p,), (p, -(-S // p))],
                             "prime": [(_next_prime(S),)],
                             "outer": [(q, -(-S // q))]}[side])
        op = self.pick(["sum", "max", "min"], [1, 2, 2])
        self.tag(f"one:{op}")

        def terms(scope, r):
            leaves = [self.leaf(scope, *r)]
            if self.chance(0.5):
                leaves.append(self.leaf(scope, *(r if self.chance(0.5) else r[-1:])))
            return self.body_over(leaves, scope)
        return self.output(self.pick([(), (1,), (1, 1)]), lambda s, _: self.reduced(s, op, extents, terms))

    def large_vector(self, T) -> Compute:
        which = self.pick(list(STRADDLED["vector"]))
        j = self.straddle(which, T.lanes if which == "vector" else T.tile_vectors * T.lanes)
        shape = (int(self.rng.integers(1, 4)), j) if self.chance(0.8) else (2, int(self.rng.integers(1, 4)), j)

        def body(scope, axes):
            *_, i, jj = axes
            leaves = [self.leaf(scope, *axes), self.leaf(scope, jj)]
            if self.chance(0.5):
                leaves.append(self.leaf(scope, jj, i))
            return self.body_over(leaves, scope)
        return self.output(shape, body)

    def large_lane_reduction(self, T) -> Compute:
        which = self.pick(list(STRADDLED["lane_reduction"]))
        k = self.straddle(which, {"reduce_lanes": T.lanes, "align": T.align_min_vectors * T.lanes,
                                  "sum_run": 8 * T.sum_run * T.lanes}[which])
        rows = int(self.pick([1, 2, 3, T.min_root + 1]))
        extents = (k,) if self.chance(0.6) else (int(self.rng.integers(2, 4)), k)     # rows inside the lanes' loop
        op = self.pick(["sum", "max", "min"], [2, 1, 1])

        def terms(scope, r):
            i = scope.vars[0]
            leaves = [self.leaf(scope, i, *r) if self.chance(0.7) else self.leaf(scope, r[-1], i)]
            if self.chance(0.5):
                leaves.append(self.leaf(scope, r[-1]))
            return self.body_over(leaves, scope)

        def body(scope, axes):
            return self.plus_outer(self.reduced(scope, op, extents, terms), scope,
                                   [self.leaf(scope, axes[0])])
        return self.output((rows,), body)

    def large_gemm(self, T) -> Compute:
        which = self.pick(list(STRADDLED["gemm"]),
                          [3, 3, 1, 3, 2, 2, 1])
        i, j, k = T.tile_rows + 1, T.tile_vectors * T.lanes + 1, T.gemm_min_trips + 1
        a_t, b_t = self.chance(0.3), self.chance(0.3)           # A[k, i], B[j, k]
        if which == "gemm_trips":
            k = self.straddle(which, T.gemm_min_trips)
        elif which == "k_block":
            k, b_t = self.straddle(which, T.k_block_min), False
        elif which == "k_block_panel":
            i, j = T.pack_min_reuse * T.tile_rows, 2 * T.tile_vectors * T.lanes
            k = self.straddle(which, T.k_block_panel_min)
        elif which == "tile_rows":
            i = self.straddle(which, T.tile_rows)
        elif which == "panel":
            j = 2 * T.tile_vectors * T.lanes
            k = self.straddle(which, T.panel_elements // j)
        elif which == "pack_reuse":
            b_t, i = True, self.straddle(which, T.pack_min_reuse)
        else:
            k, a_t = T.k_block, False
            i = self.straddle(which, T.row_block_elements // k)
        op = self.pick(["sum", "max", "min"], [4, 1, 1])
        batch = () if self.chance(0.7) else (int(self.pick([1, 2, 3])),)       # copies of a whole batch
        if batch:
            self.tag("large:batched")

        def product(scope, r):
            nb = len(batch)
            bb, (ii, jj), kk = scope.vars[:nb], scope.vars[nb:nb + 2], r[0]
            a = self.body_over([self.leaf(scope, *bb, kk, ii) if a_t else self.leaf(scope, *bb, ii, kk)], scope)
            b = self.body_over([self.leaf(scope, *bb, jj, kk) if b_t else self.leaf(scope, *bb, kk, jj)], scope)
            return self.binary_of("mul", a, b)

        def body(scope, axes):
            return self.plus_outer(self.reduced(scope, op, (k,), product), scope, [self.leaf(scope, axes[-1])])
        return self.output(batch + (i, j), body)

    def large_sums(self, T) -> Compute:
        k = self.straddle("accumulators", T.accumulators, least=2)
        if self.chance(0.3):
            k += int(self.rng.integers(1, 3)) * T.accumulators
        extents = (k,) if self.chance(0.7) else (int(self.rng.integers(2, 4)), k)
        rows = int(self.pick([1, 2, 4]))

        def product(scope, r):
            j = scope.vars[len(scope.vars) - len(r) - 1]
            a = self.body_over([self.leaf(scope, *r)], scope)
            b = self.body_over([self.leaf(scope, *r, j)], scope)
            return self.binary_of("mul", a, b)

        def body(scope, axes):
            return self.reduced(scope, "sum", extents, product)
        return self.output((rows, T.lanes) if rows > 1 else (T.lanes,), body)

    def large_transpose(self, T) -> Compute:
        which = self.pick(list(STRADDLED["transpose"]))
        i, j = T.gather_block + 1, T.lanes + 1
        if which == "gather_half":
            i = self.straddle(which, T.gather_block // 2)
        elif which == "gather_block":
            i = self.straddle(which, T.gather_block)
        elif which == "transpose_blocks":
            i, j = 2 * T.transpose_blocks * T.gather_block, self.straddle(which, T.l1_lines)
        elif which == "align_blocks":
            i, j = self.straddle(which, T.align_min_vectors * T.gather_block), T.l1_lines + 1
        else:
            i, j = self.straddle(which, T.way_elements), T.lanes

        def body(scope, axes):
            ii, jj = axes
            leaves = [self.leaf(scope, jj, ii)] + ([self.leaf(scope, ii, jj)] if self.chance(0.3) else [])
            return self.body_over(leaves, scope)
        return self.output((i, j), body)

    def large_residues(self, T) -> Compute:
        m = self.straddle("residues", T.max_residues, 2) if self.chance(0.8) else 2
        rows, cols = int(self.rng.integers(2, 6)), T.lanes + int(self.pick([-1, 0, 1]))
        c = int(self.rng.integers(m))
        extent = m * (rows - 1) + c + 1 + int(self.rng.integers(m))

        def body(scope, axes):
            i, j = axes
            x = self.add_input((extent, cols))
            strided = self.guarded_read(x, (IBin("+", IBin("*", IVar(i), IConst(m)), IConst(c)), IVar(j)), scope)
            return self.body_over([strided], scope)
        return self.output((rows, cols), body)

    def large_stencil(self, T) -> Compute:
        rows, reach = int(self.rng.integers(1, 4)), int(self.pick([1, 2]))
        if self.chance(0.5):
            j = self.straddle("interior", int(self.pick([1, 2, 4])) * T.line, 2)
        else:       # the shortest split: aligned interior [line, 3 line) as long as the borders (line + reach)
            j = self.straddle("interior_ends", 3 * T.line + reach, 2)

        def body(scope, axes):
            i, jj = axes
            x = self.add_input((rows, j))
            if self.chance(0.5):             # X[i, j - R] ... X[i, j + R], each a term of its own
                terms = [self.body_over([self.guarded_read(x, (IVar(i), plus(IVar(jj), d)), scope)], scope)
                         for d in range(-reach, reach + 1)]
                v = terms[0]
                for t in terms[1:]:
                    v = self.binary_of(self.pick(["add", "sub", "mul"]), v, t)
                return v
            w = self.add_input((2 * reach + 1,))

            def taps(inner, r):               # Σ_d W[d] * X[i, j + d - R]
                read = self.guarded_read(x, (IVar(i), plus(IBin("+", IVar(jj), IVar(r[0])), -reach)), inner)
                return self.binary_of("mul", self.body_over([read], inner), self.guarded_read(w, (IVar(r[0]),), inner))
            return self.reduced(scope, "sum", (2 * reach + 1,), taps)
        return self.output((rows, j), body)

    def large_root(self, T) -> Compute:
        which = self.pick(list(STRADDLED["root"]))
        if which == "min_root":
            shape = (self.straddle(which, T.min_root), 4 * T.lanes + 1)
        else:
            shape = (self.straddle(which, T.weighed_root), int(self.rng.integers(1, 4)))

        def body(scope, axes):
            return self.body_over([self.leaf(scope, *axes), self.leaf(scope, axes[0])], scope)
        return self.output(shape, body)

    def large_chains(self, T) -> Compute:
        depth = int(self.pick([1, 2]))
        # vector_width.chained_lanes: math_chains vectors a step through two functions, half through one
        j = self.straddle(f"chains{depth}", T.lanes * max(1, T.math_chains >> (2 - depth)), 2)
        shape = (int(self.rng.integers(1, 4)), j)

        def body(scope, axes):
            v = self.leaf(scope, *axes)
            for _ in range(depth):
                v = self.unary_of(self.pick(T.math_functions), v)
            if self.chance(0.5):
                v = self.binary_of(self.pick(["add", "mul"]), v, self.leaf(scope, axes[1]))
            return v
        return self.output(shape, body)

    def large_row_peel(self, T) -> Compute:
        reach = int(self.pick([1, 2]))
        rows = self.straddle("row_peel", T.tile_rows, 1) + 2 * reach       # the interior: rows - 2 reach
        cols, chans = T.tile_vectors * T.lanes + int(self.pick([-1, 0, 1])), T.gemm_min_trips
        shape = (int(self.rng.integers(2, 4)), rows, cols)

        def body(scope, axes):
            b, i, j = axes
            x, w = self.add_input((shape[0], rows, chans)), self.add_input((2 * reach + 1, chans, cols))

            def taps(inner, r):               # Σ_{d, c} X[b, i + d - R, c] * W[d, c, j]
                d, c = r
                read = self.guarded_read(x, (IVar(b), plus(IBin("+", IVar(i), IVar(d)), -reach), IVar(c)), inner)
                return self.binary_of("mul", self.body_over([read], inner),
                                      self.guarded_read(w, (IVar(d), IVar(c), IVar(j)), inner))
            return self.reduced(scope, self.pick(["sum", "max", "min"], [4, 1, 1]), (2 * reach + 1, chans), taps)
        return self.output(shape, body)

    def large_nested(self, T) -> Compute:
        k = self.straddle("loop_reuse", T.pack_min_reuse)
        rows = int(self.pick([T.lanes + 1, T.lanes * max(1, T.math_chains // 2) + 1]))
        depth = int(self.rng.integers(1, 2 * T.gemm_min_trips))
        contraction = self.chance(0.4)

        def terms(scope, r):                 # f(A[i, e], B[j, e])
            i, j, e = scope.vars[0], scope.vars[1], r[0]
            a, b = self.leaf(scope, i, e), self.leaf(scope, j, e)
            if contraction:
                return self.binary_of("mul", self.body_over([a], scope), self.body_over([b], scope))
            return self.body_over([a, b], scope)

        def body(scope, axes):
            outer = self.pick(["sum", "max", "min"], [1, 2, 2])
            return self.reduced(scope, outer, (k,), lambda inner, _: self.reduced(inner, "sum", (depth,), terms))
        return self.output((rows,), body)
