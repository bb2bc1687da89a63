"""Tutorial 03: sharing -- why gradients stay linear in the size of the program.

A value used several times is one node of the expression DAG, not several
copies: expression nodes are hash-consed, derivative rules refer to the primal
nodes (d sin(v) = cos(v) dv reads the same v), ``te.pretty`` and the loop IR
let-bind every node used more than once, and every pass memoises on node
identity.  This tutorial builds a program whose tree is astronomically large
and whose DAG is small, differentiates it, and shows what the sizes would be
without sharing.  The last step is about sharing *between* forward and
backward: values both need are computed once, and ``store=``/``recompute=``
decide which intermediates get a buffer.

Run it:  python tutorials/03_sharing.py
"""
import time

import numpy as np
import ortools.sat.python.cp_model  # noqa: F401 -- the solver zero elimination asks, imported outside the timings

import te_autodiff as te
from te_autodiff.pretty import tensor_str
from te_autodiff.visit import children, count_nodes, topo_order

LEVELS = 40


def deep(v, levels):
    """v <- sin(v)*v*0.05 + v: each level reads the previous value three times."""
    for _ in range(levels):
        v = te.sin(v) * v * 0.05 + v
    return v


def tree_nodes(e) -> int:
    """Nodes of ``e`` unfolded into a tree, counted bottom-up with a memo
    (the tree itself is never built: it would not fit in any memory)."""
    size = {}
    for n in topo_order([e]):
        size[n] = 1 + sum(size[c] for c in children(n))
    return size[e]


# Step 1 -- the forward program: 40 levels in one formula.
n = 8
X = te.placeholder((n,), "float64", name="X")
Y = te.compute((n,), lambda i: deep(X[i], LEVELS), name="Y")
print(f"Step 1: a {LEVELS}-level formula, first lines of te.pretty")
print("\n".join(te.pretty(Y).splitlines()[:6] + ["  ..."]))
print(f"  distinct nodes (the DAG):    {count_nodes([Y.body]):,}")
print(f"  nodes of the unfolded tree:  {tree_nodes(Y.body):,}")

# Step 2 -- the gradient.  Its formula refers to the primal values v_k (for
# cos(v_k) and the factors v_k) instead of copying them, so it is let-bound
# just like the forward.
t0 = time.perf_counter()
dX, = te.gradient(Y, [X])
t_grad = time.perf_counter() - t0
text = te.pretty(dX)
print(f"\nStep 2: te.gradient took {t_grad * 1000:.0f} ms; te.pretty(dX) is {len(text):,} characters:")
print(text)
print(f"  distinct nodes of dX:        {count_nodes([dX.body]):,}")
print(f"  nodes of its unfolded tree:  {tree_nodes(dX.body):,}")

# Step 3 -- what goes wrong without sharing.  Print shallow versions of the
# same program with and without let-bindings: the unshared text triples with
# every level, the shared one grows by a constant.
print("\nStep 3: size of te.pretty(gradient) with and without let-binding")
print(f"  {'levels':>6} {'shared':>8} {'unshared':>10} {'tree nodes':>12}")
per_node = []
for levels in (1, 2, 3, 4, 5, 6):
    Xs = te.placeholder((n,), "float64", name="X")
    Ys = te.compute((n,), lambda i: deep(Xs[i], levels), name="Y")
    g, = te.gradient(Ys, [Xs])
    shared, unshared, nodes = len(tensor_str(g)), len(tensor_str(g, share=False)), tree_nodes(g.body)
    per_node.append(unshared / nodes)
    print(f"  {levels:>6} {shared:>8,} {unshared:>10,} {nodes:>12,}")
chars = tree_nodes(dX.body) * per_node[-1]
print(f"  {LEVELS:>6} {len(text):>8,} {chars:>10.2e} {tree_nodes(dX.body):>12.2e}   (40 levels: estimated"
      f" from the tree size, {per_node[-1]:.1f} characters per node)")
print(f"Unshared, the gradient's text would be about {chars / 2**80:.1e} YiB; every pass that walked it"
      " as a tree\n(differentiation, simplification, lowering, code generation) would take as long.")

# Step 4 -- build forward and gradient together and check them against numpy.
t0 = time.perf_counter()
kernel = te.build([X], [Y, dX])
t_build = time.perf_counter() - t0
x = np.linspace(-2.0, 2.0, n)
y, dx = kernel(x)
v, d = x.copy(), np.ones(n)
for _ in range(LEVELS):
    d = d * (0.05 * (np.cos(v) * v + np.sin(v)) + 1.0)
    v = np.sin(v) * v * 0.05 + v
assert np.allclose(y, v, rtol=1e-10) and np.allclose(dx, d, rtol=1e-9)
print(f"\nStep 4: te.build took {t_build:.2f} s; results match numpy (max |dX - ref| ="
      f" {np.abs(dx - d).max():.1e}).")
print("The loop IR binds each shared value once (first lines of the gradient's stage):")
lines = kernel.loop_ir.splitlines()
start = lines.index("stage dX:")
print("\n".join(lines[start:start + 8] + ["    ..."]))

# Step 5 -- sharing between forward and backward, and store vs recompute.
# A two-layer network with a ReLU: the forward and the backward both need the
# first layer's pre-activation Z1; building them together computes it once.
b, d_in, hidden, d_out = 128, 64, 96, 16
Xb = te.placeholder((b, d_in), "float32", name="X")
W1 = te.placeholder((d_in, hidden), "float32", name="W1")
W2 = te.placeholder((hidden, d_out), "float32", name="W2")
T = te.placeholder((b, d_out), "float32", name="T")
k, k2 = te.reduce_axis(d_in, "k"), te.reduce_axis(hidden, "k2")
Z1 = te.compute((b, hidden), lambda i, j: te.sum(Xb[i, k] * W1[k, j], axis=k), name="Z1")
A = te.compute((b, hidden), lambda i, j: te.maximum(Z1[i, j], 0.0), name="A")
Z2 = te.compute((b, d_out), lambda i, j: te.sum(A[i, k2] * W2[k2, j], axis=k2), name="Z2")
r, s = te.reduce_axis(b, "r"), te.reduce_axis(d_out, "s")
L = te.compute((), lambda: 0.5 * te.sum((Z2[r, s] - T[r, s]) * (Z2[r, s] - T[r, s]), axis=[r, s]),
               name="L")
dW1, dW2 = te.gradient(L, [W1, W2])
ins = [Xb, W1, W2, T]
fwd, bwd = te.cost(ins, [L]), te.cost(ins, [dW1, dW2])
both = te.cost(ins, [L, dW1, dW2])
print("\nStep 5: a 2-layer ReLU network, innermost iterations")
print(f"  forward alone          {fwd['iterations']:>9,}")
print(f"  backward alone         {bwd['iterations']:>9,}")
print(f"  sum of the two         {fwd['iterations'] + bwd['iterations']:>9,}")
print(f"  built together         {both['iterations']:>9,}   (Z1, Z2 computed once)")
assert both["iterations"] < fwd["iterations"] + bwd["iterations"]

# The ReLU A is trivial (one max on a load), so the default rule recomputes
# it wherever it is read -- even inside the reductions of Z2 and dW2.
# store=[A] gives it a buffer instead: one more stage and its bytes, and no
# max in the inner loops.  The results are the same.
rng = np.random.default_rng(0)
arrays = [(rng.standard_normal(t.shape) * 0.3).astype("float32") for t in ins]
print(f"\n  {'':20s} {'iterations':>10s} {'temp bytes':>10s} {'stages':>6s} {'run time':>9s}")
results = {}
for label, kw in (("default (A inlined)", {}), ("store=[A]", {"store": [A]})):
    c = te.cost(ins, [L, dW1, dW2], **kw)
    f = te.build(ins, [L, dW1, dW2], **kw)
    f(*arrays)
    t0 = time.perf_counter()
    for _ in range(20):
        results[label] = f(*arrays)
    per_call = (time.perf_counter() - t0) / 20
    print(f"  {label:20s} {c['iterations']:>10,} {c['temp_bytes']:>10,} {c['stages']:>6} "
          f"{per_call * 1e6:>7.0f} us")
for a, b_ in zip(*results.values()):
    np.testing.assert_allclose(a, b_, rtol=1e-5, atol=1e-6)
print("  same results either way.")

# The other side of the rule: a transcendental activation read inside the
# reductions of the next layer and of the weight gradient is stored by
# default.  recompute=[H] would evaluate tanh once per multiply-add.
H = te.compute((b, hidden), lambda i, j: te.tanh(Z1[i, j]), name="H")
Z2t = te.compute((b, d_out), lambda i, j: te.sum(H[i, k2] * W2[k2, j], axis=k2), name="Z2")
Lt = te.compute((), lambda: 0.5 * te.sum((Z2t[r, s] - T[r, s]) * (Z2t[r, s] - T[r, s]), axis=[r, s]),
                name="L")
outs = [Lt] + te.gradient(Lt, [W1, W2])
print(f"\n  tanh network:        {'iterations':>10s} {'temp bytes':>10s} {'stages':>6s} {'run time':>9s}")
for label, kw in (("default (H stored)", {}), ("recompute=[H]", {"recompute": [H]})):
    c = te.cost(ins, outs, **kw)
    f = te.build(ins, outs, **kw)
    f(*arrays)
    t0 = time.perf_counter()
    for _ in range(20):
        f(*arrays)
    per_call = (time.perf_counter() - t0) / 20
    print(f"  {label:20s} {c['iterations']:>10,} {c['temp_bytes']:>10,} {c['stages']:>6} "
          f"{per_call * 1e6:>7.0f} us")
print("iterations count loop bodies, not the work inside them: recomputing H saves a stage but runs"
      "\ntanh inside both reductions.  The rule and its table are in lowering/lower.py.")
