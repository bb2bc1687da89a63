"""Tutorial 02: Jacobians, and how zero elimination makes gradients cheap.

A strided convolution reads each input element from only a few outputs, so
its Jacobian is almost all zeros.  The textbook gradient sums head * J over
*every* output element for every input element; te-autodiff instead solves
the index equations over the integers and sums over the non-zero entries only.
When an index is read from data (an embedding's word ids), the equation is
solved at run time instead: an inverse index lists each value's matches.
A strided read's gradient keeps a test on the parity of a row, which the
schedule turns into one stage per residue class.

Run it:  python tutorials/02_jacobians_and_zero_elimination.py
"""
import time

import numpy as np

import te_autodiff as te

# Step 1 -- a 1-D convolution with stride 2 and a 3-tap kernel.
n, taps, stride = 12, 3, 2
m = (n - taps) // stride + 1
X = te.placeholder((n,), "float64", name="X")
K = te.placeholder((taps,), "float64", name="K")
r = te.reduce_axis(taps, name="r")
Y = te.compute((m,), lambda i: te.sum(X[stride * i + r] * K[r], axis=r), name="Y")
print("Step 1: the forward formula")
print(te.pretty(Y))

# Step 2 -- its Jacobian with respect to X, as a formula and as numbers.  The
# indicator of each access (j == 2*i + r) has been solved for r already: the
# reduction is gone and one select per element is left.
J = te.jacobian(Y, X)
print("\nStep 2: the Jacobian dY[i]/dX[j]")
print(te.pretty(J))
rng = np.random.default_rng(0)
x, k = rng.standard_normal(n), rng.standard_normal(taps)
jac = te.build([X, K], [J])(x, k)
print("non-zero pattern (rows: outputs i, columns: inputs j):")
for row in jac:
    print("  " + "".join("#" if v != 0 else "." for v in row))
# As written (optimize=False), each entry is the sum over the taps of the
# indicator [j == 2*i + r] * K[r]: every (i, j) pair is visited, each with
# all its taps.  Zero elimination keeps only the pairs that can be non-zero.
naive_jac = te.jacobian(Y, X, optimize=False)
visited = te.cost([X, K], [naive_jac])["iterations"]
kept = np.count_nonzero(jac)
assert visited == m * n * taps
print(f"as written: {m} x {n} pairs x {taps} taps = {visited} iterations (te.cost); non-zeros kept: {kept}")
try:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 2.6))
    left.spy(np.ones_like(jac), marker="s", markersize=11, color="tab:red")
    left.set_title(f"as written (optimize=False): all {m} x {n} (i, j)\n"
                   f"x {taps} taps = {visited} iterations (te.cost)", fontsize=9)
    right.spy(jac, marker="s", markersize=11, color="tab:blue")
    right.set_title(f"zero elimination keeps the {kept} non-zeros\n"
                    f"of dY[i]/dX[j] (j == {stride}*i + r, r < {taps})", fontsize=9)
    for ax in (left, right):
        ax.set(xlabel="input j", ylabel="output i")
        ax.tick_params(top=False, labeltop=False, bottom=True, labelbottom=True)
    fig.savefig("02_zero_elimination.png", dpi=100, bbox_inches="tight")
    plt.close(fig)
    print("the naive and the kept region side by side saved to 02_zero_elimination.png")
except ImportError:
    print("(install matplotlib for a picture of the naive and the kept region)")

# Step 3 -- the gradient for a head H, naive and optimised.  The naive form
# (optimize=False) is the literal composition sum_i H[i] * J[i, j]; the
# optimised form is what te.gradient returns by default.
H = te.placeholder((m,), "float64", name="H")
naive, = te.gradient(Y, [X], head=H, optimize=False)
fast, = te.gradient(Y, [X], head=H)
print("\nStep 3: the naive gradient")
print(te.pretty(naive))
print("the optimised gradient")
print(te.pretty(fast))

# What the solver found: j == 2*i + r has, for each j, the solutions
# r = j - 2*i with i free; the tap range 0 <= r < 3 bounds i to
# ceil((j - 2) / 2) <= i <= floor(j / 2), and 0 <= i < m clips it at the
# edges.  So each dX[j] sums over at most two outputs instead of all m.

# Step 4 -- both give the same numbers; the cost tells them apart.
h = rng.standard_normal(m)
dn = te.build([X, K, H], [naive])(x, k, h)
df = te.build([X, K, H], [fast])(x, k, h)
reference = np.zeros(n)
for i in range(m):
    reference[stride * i:stride * i + taps] += h[i] * k
assert np.allclose(dn, reference) and np.allclose(df, reference)
cost_forward = te.cost([X, K], [Y])["iterations"]
cost_naive = te.cost([X, K, H], [naive])["iterations"]
cost_fast = te.cost([X, K, H], [fast])["iterations"]
print("\nStep 4: innermost iterations")
print(f"  forward   {cost_forward:6d}")
print(f"  naive     {cost_naive:6d}   (n * m * taps: every output for every input)")
print(f"  optimised {cost_fast:6d}   (only the non-zero entries)")
assert cost_fast < cost_naive

# Step 5 -- the same works in 2-D: a max-pooling gradient reads the forward's
# argmax and becomes a pure gather, one select per input element.
P = te.placeholder((4, 4), "float64", name="P")
a, b = te.reduce_axis(2, name="a"), te.reduce_axis(2, name="b")
M = te.compute((2, 2), lambda i, j: te.max(P[2 * i + a, 2 * j + b], axis=[a, b]), name="M")
dP, = te.gradient(M, [P])
print("\nStep 5: the max-pool gradient")
print(te.pretty(dP))

# Step 6 -- indices read from data.  An embedding bag sums the rows of a
# table E picked by word ids: bag[b, d] = sum_k E[I[b, k], d].  The gradient
# wrt E holds the equality v == I[b, k], which reads tensor data: the integer
# solver cannot use it, and as written (optimize=False) every table row sums
# over every id.
def embedding_bag(V, D, B, L, dtype):
    """B bags of L ids into a V x D table: the table, the ids, a head for the
    bags' gradient, and the bags."""
    E = te.placeholder((V, D), dtype, name="E")
    I = te.placeholder((B, L), "int32", name="I")
    k = te.reduce_axis(L, name="k")
    bag = te.compute((B, D), lambda b, d: te.sum(E[I[b, k], d], axis=k), name="bag")
    return E, I, te.placeholder((B, D), dtype, name="G"), bag


V, D, B, L = 50, 4, 3, 5
E, I, G, bag = embedding_bag(V, D, B, L, "float64")
slow, = te.gradient(bag, [E], head=G, optimize=False)
print("\nStep 6: an embedding bag's gradient, as written")
print(te.pretty(slow))

# te.gradient inverts the index at run time instead: I_inv holds, for each
# value v, where its matches start (elements 0..V) and then the matching
# positions (b, k) flattened, sorted by value.  A counting sort fills it in
# O(B*L + V); each row of dE then sums its own matches only, in a fixed
# order: no atomics, the same bits for any thread count.
fast, = te.gradient(bag, [E], head=G)
print("with an inverse index")
print(te.pretty(fast))
ids = rng.integers(0, V, (B, L)).astype("int32")
g = rng.standard_normal((B, D))
ds, dfast = te.build([E, I, G], [slow, fast])(rng.standard_normal((V, D)), ids, g)
reference = np.zeros((V, D))
np.add.at(reference, ids, np.repeat(g[:, None, :], L, axis=1))
assert np.allclose(ds, reference) and np.allclose(dfast, reference)
print("innermost iterations: as written", te.cost([E, I, G], [slow])["iterations"],
      "  inverted", te.cost([E, I, G], [fast])["iterations"])

# Step 7 -- at a language model's size: 2048 ids into a 30000 x 64 table,
# against numpy's np.add.at (the same sum, element by element).
V, D, B, L = 30000, 64, 256, 8
E, I, G, bag = embedding_bag(V, D, B, L, "float32")
dE, = te.gradient(bag, [E], head=G)
kernel = te.build([E, I, G], [bag, dE])
e = rng.standard_normal((V, D)).astype("float32")
ids = rng.integers(0, V, (B, L)).astype("int32")
g = rng.standard_normal((B, D)).astype("float32")


def best_ms(f, repeat=20):
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        f()
        times.append(time.perf_counter() - start)
    return 1e3 * min(times)


def numpy_step():
    grad = np.zeros_like(e)
    np.add.at(grad, ids, np.repeat(g[:, None, :], L, axis=1))
    return e[ids].sum(1), grad


_, got = kernel(e, ids, g)
assert np.allclose(got, numpy_step()[1], atol=1e-4)
print(f"\nStep 7: bag forward + gradient, {B * L} ids into a {V} x {D} table")
print(f"  te-autodiff {best_ms(lambda: kernel(e, ids, g)):7.3f} ms")
print(f"  numpy       {best_ms(numpy_step):7.3f} ms   (np.add.at)")

# Step 8 -- back to strides, on the reading side: B[i, j] = A[2j + 1, i]
# reads every other row of A, transposed.  Zero elimination leaves one test
# per element of dA, on the parity of its row: odd rows copy a column of the
# head, even rows are zero.  The row alone decides that test, so the
# schedule runs dA as one stage per residue class of the row (r = 2w and
# r = 2w + 1): a zero fill, and a copy reading H[c, w] with no test left.
A = te.placeholder((8, 3), "float32", name="A")
Bt = te.compute((3, 4), lambda i, j: A[2 * j + 1, i], name="B")
H = te.placeholder((3, 4), "float32", name="H")
dA, = te.gradient(Bt, [A], head=H)
print("\nStep 8: the gradient of a strided read")
print(te.pretty(dA))
kernel = te.build([A, H], [dA])
print("  stages:", ", ".join(st.name for st in kernel.program.stages))
h = rng.standard_normal((3, 4)).astype("float32")
reference = np.zeros((8, 3), "float32")
reference[1::2] = h.T
assert np.array_equal(kernel(np.zeros((8, 3), "float32"), h), reference)
print("  odd rows hold H transposed, even rows zero: matches numpy")
