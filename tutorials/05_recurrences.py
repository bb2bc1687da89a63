"""Tutorial 05: recurrences -- an RNN with te.scan, its gradient as a reverse scan.

A recurrent network computes h_t from h_(t-1): unrolled into T computes its
program (and its build time) grows with T.  ``te.scan`` states the
recurrence once, in TVM's form: a *state* placeholder whose first axis is
time, an ``init`` for the first step(s) and an ``update`` that reads the
state only at earlier times.  The gradient of a scan is another scan that
runs backward in time (the adjoint of the state), and both lower to one loop
over time: the step is compiled once, whatever T.

The task: read a sequence of T numbers and output their mean (a
"sequence-sum" RNN), trained with a few steps of gradient descent.

Run it:  python tutorials/05_recurrences.py
"""
import time

import numpy as np

import te_autodiff as te

B, H = 32, 16                                # batch, hidden units


def model(T, dtype="float32"):
    """Elman RNN h_t = tanh(W h_(t-1) + U x_t), h_0 = 0, read out y = v·h_T;
    loss = mean over the batch of (y - target)²."""
    X = te.placeholder((T, B), dtype, name="X")              # one number per step and sequence
    target = te.placeholder((B,), dtype, name="target")
    W = te.placeholder((H, H), dtype, name="W")
    U = te.placeholder((H,), dtype, name="U")
    v = te.placeholder((H,), dtype, name="v")
    S = te.placeholder((T + 1, B, H), dtype, name="S")       # the state: h_0 ... h_T
    h0 = te.compute((1, B, H), lambda _, b, i: te.const(0.0, dtype), name="h0")
    j = te.reduce_axis(H, "j")
    step = te.compute((T + 1, B, H), lambda t, b, i: te.tanh(te.sum(W[i, j] * S[t - 1, b, j], axis=j)
                                                             + U[i] * X[t - 1, b]), name="step")
    hs = te.scan(h0, step, S, inputs=[X], name="hs")         # hs[t] = h_t for every t
    k, b = te.reduce_axis(H, "k"), te.reduce_axis(B, "b")
    y = te.compute((B,), lambda n: te.sum(v[k] * hs[T, n, k], axis=k), name="y")
    loss = te.compute((1,), lambda _: te.sum((y[b] - target[b]) * (y[b] - target[b]), axis=b) / B, name="loss")
    return [X, target, W, U, v], hs, loss


def data(rng, T):
    x = rng.uniform(-1, 1, (T, B)).astype("float32")
    return x, x.mean(axis=0)


rng = np.random.default_rng(0)

# Step 1 -- the recurrence, written once.  te.pretty shows the scan: its state,
# where its first step comes from, and the step body reading S at t - 1.
T = 16
(X, target, W, U, v), hs, loss = model(T)
print("Step 1: the hidden states as a scan")
print(te.pretty(hs))

# Step 2 -- it computes what the loop computes.
w = rng.standard_normal((H, H)).astype("float32") * 0.4
u = rng.standard_normal(H).astype("float32")
vv = rng.standard_normal(H).astype("float32") * 0.1
x, tgt = data(rng, T)
h = np.zeros((T + 1, B, H), "float32")
for t in range(1, T + 1):
    h[t] = np.tanh(h[t - 1] @ w.T + x[t - 1][:, None] * u)
got = te.build([X, W, U], [hs])(x, w, u)
print(f"\nStep 2: te.scan vs a numpy loop over {T} steps: max |difference| = {np.abs(got - h).max():.1e}")
assert np.allclose(got, h, atol=1e-5)

# Step 3 -- the gradient.  te.gradient differentiates through the scan with a
# *reverse scan*: its state is the adjoint of h_t, carried from t = T back to
# t = 0 (scan 'hs.back', time u = T - t).  Each step applies the transposed
# Jacobian of one forward step; it reads the forward states (hs) instead of
# recomputing them.  The weight gradient sums every step's contribution:
# one reduction over time, after the reverse scan.  (A weight each step reads
# element by element, a per-unit decay, is summed as the reverse scan runs
# instead: one more state of 'hs.back', its running total.)
dW, dU, dv = te.gradient(loss, [W, U, v])
text = te.pretty(dW)
print("\nStep 3: te.pretty(dW), the reverse scan and the sum over time:")
back = text[text.index("scan hs.back"):]
print("\n".join(line for line in back.splitlines() if not line.startswith("hs = ")))

# Step 4 -- two oracles: finite differences (te.check_gradient runs the
# program in float64) on a short sequence.
small = model(5)
ins, _, small_loss = small
check = [rng.uniform(-1, 1, (5, B)), rng.uniform(-1, 1, B), w, u, vv]
te.check_gradient(small_loss, ins, check, rtol=1e-4)
print("\nStep 4: te.check_gradient agrees with central finite differences for X, target, W, U, v")

# Step 5 -- one loop over time.  The loop IR has a 'time loop' around the
# stages of one step, forward and backward; for T = 256 it is the same
# program with other extents, so the build does not grow with T, while the
# work (te.cost's iterations) grows linearly.
print("\nStep 5: build for T = 16 and T = 256")
kernels = {}
for steps in (16, 256):
    ins, _, lo = model(steps)
    t0 = time.perf_counter()
    grads = te.gradient(lo, ins[2:])
    kernels[steps] = te.build(ins, [lo] + grads)
    seconds = time.perf_counter() - t0
    iterations = te.cost(ins, [lo] + grads)["iterations"]
    k = kernels[steps]
    print(f"  T = {steps:3d}: derive + build {seconds:.2f} s, {len(k.program.stages)} stages, "
          f"{k.loop_ir.count(chr(10))} lines of loop IR, {iterations:,} iterations")
print("  the forward and reverse time loops of T = 16:")
print("\n".join("    " + line for line in kernels[16].loop_ir.splitlines() if line.startswith("time loop")))
assert kernels[16].loop_ir.count("\n") == kernels[256].loop_ir.count("\n")

# Step 6 -- training: plain gradient descent on W, U, v with the T = 16
# kernel, a new batch of sequences each step.
f, lr = kernels[16], 0.1
params = [w, u, vv]
print("\nStep 6: gradient descent, loss every 20 steps")
history = []
for it in range(100):
    x, tgt = data(rng, 16)
    value, *grads = f(x, tgt, *params)
    params = [p - lr * g for p, g in zip(params, grads)]
    history.append(float(value[0]))
    if it % 20 == 0 or it == 99:
        print(f"  step {it:3d}: loss {np.mean(history[-20:]):.4f}")
assert np.mean(history[-20:]) < 0.5 * np.mean(history[:20]), "the loss should fall"
