"""Tutorial 01: a first gradient, from formula to native code.

We write a tiny model as index formulas, ask te-autodiff for its gradient,
read the formula it derived, compile forward and backward into one native
kernel, and check the result twice: against finite differences and against
a backward pass written by hand in numpy.

Run it:  python tutorials/01_first_gradient.py
"""
import numpy as np

import te_autodiff as te

# Step 1 -- the model: one dense layer with a tanh, and a squared-error loss
# against targets T.  Every tensor is a formula for one element.
batch, n_in, n_out = 8, 5, 3
X = te.placeholder((batch, n_in), name="X")
W = te.placeholder((n_out, n_in), name="W")
T = te.placeholder((batch, n_out), name="T")
k = te.reduce_axis(n_in, name="k")
Y = te.compute((batch, n_out), lambda i, j: te.tanh(te.sum(X[i, k] * W[j, k], axis=k)), name="Y")
b = te.reduce_axis(batch, name="b")
o = te.reduce_axis(n_out, name="o")
L = te.compute((1,), lambda _: te.sum((Y[b, o] - T[b, o]) * (Y[b, o] - T[b, o]), axis=[b, o]) / batch,
               name="L")
print("Step 1: the forward program")
print(te.pretty(L))

# Step 2 -- the gradient of the loss with respect to the weights.  The result
# is an ordinary tensor: its formula reads the stored forward values (Y) and
# the adjoint of Y, and each element is computed independently (a gather).
dW, = te.gradient(L, [W])
print("\nStep 2: the gradient formula")
print(te.pretty(dW))

# Step 3 -- compile loss and gradient together and run them on numpy arrays.
kernel = te.build([X, W, T], [L, dW])
rng = np.random.default_rng(0)
x = rng.standard_normal((batch, n_in)).astype("float32")
w = rng.standard_normal((n_out, n_in)).astype("float32") * 0.5
t = rng.standard_normal((batch, n_out)).astype("float32")
loss, dw = kernel(x, w, t)
print("\nStep 3: the compiled loop nest")
print(kernel.loop_ir)
print(f"loss = {loss[0]:.6f}")

# Step 4 -- check against a backward pass written by hand ...
y = np.tanh(x @ w.T)
dy = 2 * (y - t) / batch
dw_numpy = (dy * (1 - y * y)).T @ x
print("\nStep 4: largest difference to the numpy backward:", float(np.abs(dw - dw_numpy).max()))
assert np.allclose(dw, dw_numpy, rtol=1e-4, atol=1e-5)

# ... and against central finite differences (te.check_gradient works in float64).
grads = te.check_gradient(L, [X, W, T], [x, w, t])
print("finite differences agree; |dW| =", float(np.linalg.norm(grads[1])))

# Step 5 -- what it costs: the exact number of innermost loop iterations.
print("\nStep 5: cost of forward + backward:", te.cost([X, W, T], [L, dW]))
