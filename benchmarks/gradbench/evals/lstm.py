"""GradBench ``lstm``: ADBench's LSTM (diagonal weights) over a character
sequence, its loss and the gradient of the loss with respect to the
parameters.

Per time step t (reading ``sequence[t]``, predicting ``sequence[t + 1]``)
and layer L, with the layer's input ``in`` (``sequence[t] * in_weight``
for the first layer, the previous layer's new hidden state after that):

    forget = sigmoid(in * w_f + b_f)       ingate = sigmoid(h * w_i + b_i)
    outgate = sigmoid(in * w_o + b_o)      change = tanh(h * w_c + b_c)
    c' = c * forget + ingate * change      h' = outgate * tanh(c')
    ypred = h'_last * out_weight + out_bias,   lse = log(sum exp(ypred) + 2)
    loss = -sum_t sum_i sequence[t + 1, i] (ypred_ti - lse_t) / ((c - 1) b)

``main_params`` holds for layer L the weights (row 2L) and biases (row
2L + 1) of forget, ingate, outgate, change, b values each; ``extra_params``
the in weight, out weight and out bias; ``state`` the hidden (row 2L) and
cell (row 2L + 1) state of each layer. The recurrence is one ``te.scan``
over the time steps with a hidden and a cell state per layer (layer L's
update reads layer L - 1's update of the same step: a chain); the gradient
is ``te.gradient`` of the loss, flattened row by row as GradBench asks.
"""
from functools import lru_cache

import numpy as np

import te_autodiff as te

from ..function import function, scalar, vector


def loss(main: te.Tensor, extra: te.Tensor, state: te.Tensor, sequence: te.Tensor) -> te.Tensor:
    """The objective, shape (1,)."""
    layers = main.shape[0] // 2
    c, b = sequence.shape
    # scan time t = 0 is the given state, t >= 1 the state after reading sequence[t - 1]
    hidden = [te.placeholder((c, b), dtype="float64", name=f"h{L}") for L in range(layers)]
    cell = [te.placeholder((c, b), dtype="float64", name=f"c{L}") for L in range(layers)]
    x_in = te.compute((c, b), lambda t, i: sequence[t, i] * extra[0, i], name="x_in")

    new_h, new_c = [], []
    for L in range(layers):
        H, C = hidden[L], cell[L]

        def w(gate, i, L=L):
            return main[2 * L, gate * b + i]

        def bias(gate, i, L=L):
            return main[2 * L + 1, gate * b + i]

        below = new_h[-1] if L else None

        def inp(t, i, below=below):
            return below[t, i] if below is not None else x_in[t - 1, i]

        def cell_update(t, i, H=H, C=C, w=w, bias=bias, inp=inp):
            forget = te.sigmoid(inp(t, i) * w(0, i) + bias(0, i))
            ingate = te.sigmoid(H[t - 1, i] * w(1, i) + bias(1, i))
            change = te.tanh(H[t - 1, i] * w(3, i) + bias(3, i))
            return C[t - 1, i] * forget + ingate * change

        c_new = te.compute((c, b), cell_update, name=f"cell{L}")

        def hidden_update(t, i, c_new=c_new, w=w, bias=bias, inp=inp):
            outgate = te.sigmoid(inp(t, i) * w(2, i) + bias(2, i))
            return outgate * te.tanh(c_new[t, i])

        new_c.append(c_new)
        new_h.append(te.compute((c, b), hidden_update, name=f"hidden{L}"))

    init_h = [te.compute((1, b), lambda _, i, L=L: state[2 * L, i], name=f"h{L}_0") for L in range(layers)]
    init_c = [te.compute((1, b), lambda _, i, L=L: state[2 * L + 1, i], name=f"c{L}_0") for L in range(layers)]
    states = te.scan(init_h + init_c, new_h + new_c, hidden + cell, inputs=[sequence], name="lstm")
    last = states[layers - 1]

    # prediction after reading sequence[t], t = 0 .. c - 2, against sequence[t + 1]
    ypred = te.compute((c - 1, b), lambda t, i: last[t + 1, i] * extra[1, i] + extra[2, i], name="ypred")
    j = te.reduce_axis(b, name="j")
    lse = te.compute((c - 1,), lambda t: te.log(te.sum(te.exp(ypred[t, j]), axis=j) + 2.0), name="lse")
    t, i = te.reduce_axis(c - 1, name="t"), te.reduce_axis(b, name="i")
    return te.compute((1,), lambda _: -te.sum(sequence[t + 1, i] * (ypred[t, i] - lse[t]), axis=[t, i])
                      / ((c - 1) * b), name="loss")


@lru_cache(maxsize=16)
def kernel(which: int, layers: int, c: int, b: int):
    """The objective (``which`` 0) or jacobian (1) kernel for ``layers`` layers, ``c`` characters of
    ``b`` bits."""
    main = te.placeholder((2 * layers, 4 * b), dtype="float64", name="main_params")
    extra = te.placeholder((3, b), dtype="float64", name="extra_params")
    state = te.placeholder((2 * layers, b), dtype="float64", name="state")
    sequence = te.placeholder((c, b), dtype="float64", name="sequence")
    y = loss(main, extra, state, sequence)
    d_main, d_extra = te.gradient(y, [main, extra])
    inputs = [main, extra, state, sequence]
    if which == 0:
        return te.build(inputs, [y], name="lstm")
    return te.build(inputs, [d_main, d_extra], name="lstm_jacobian")


def _prepare(which):
    def pre(input):
        arrays = [np.asarray(input[key], dtype=np.float64)
                  for key in ("main_params", "extra_params", "state", "sequence")]
        layers = arrays[0].shape[0] // 2
        c, b = arrays[3].shape
        return kernel(which, layers, c, b), arrays
    return pre


@function(pre=_prepare(0), post=scalar)
def objective(prepared):
    kernel, arrays = prepared
    return kernel(*arrays)


def _flat(grads):
    return vector(np.concatenate([g.reshape(-1) for g in grads]))


@function(pre=_prepare(1), post=_flat)
def jacobian(prepared):
    kernel, arrays = prepared
    return kernel(*arrays)
