"""te kernels inside PyTorch and JAX (``te_autodiff.torch.op``, ``te_autodiff.jax.op``):
values and gradients against the frameworks' own autograd, gradcheck /
check_grads in float64, torch.compile without a graph break, no copies of
contiguous inputs, clear errors.  Skipped when the framework is not installed
(CI installs both)."""
import numpy as np
import pytest

import te_autodiff as te

n, m, p = 5, 4, 3


def program(dtype="float64"):
    """``C = tanh(A·B) + onehot(L)`` and ``D = Σ_k A²``: two outputs, an int input."""
    A = te.placeholder((n, m), dtype, name="A")
    B = te.placeholder((m, p), dtype, name="B")
    L = te.placeholder((n,), "int32", name="L")
    k = te.reduce_axis(m, "k")
    C = te.compute((n, p), lambda i, j: te.tanh(te.sum(A[i, k] * B[k, j], axis=k))
                   + te.if_then_else(te.equal(L[i], j), 1.0, 0.0), name="C")
    k2 = te.reduce_axis(m, "k2")
    D = te.compute((n,), lambda i: te.sum(A[i, k2] * A[i, k2], axis=k2), name="D")
    return [A, B, L], [C, D]


def test_torch_op_values_gradients_and_gradcheck():
    torch = pytest.importorskip("torch")
    import te_autodiff.torch as tet
    f = tet.op(*program())
    a = torch.randn(n, m, dtype=torch.float64, requires_grad=True)
    b = torch.randn(m, p, dtype=torch.float64, requires_grad=True)
    lab = torch.tensor(np.arange(n) % p, dtype=torch.int32)
    c, d = f(a, b, lab)
    onehot = torch.nn.functional.one_hot(lab.long(), p).double()
    torch.testing.assert_close(c, torch.tanh(a @ b) + onehot)
    torch.testing.assert_close(d, (a * a).sum(1))
    hc, hd = torch.randn(n, p, dtype=torch.float64), torch.randn(n, dtype=torch.float64)
    got = torch.autograd.grad((c * hc).sum() + (d * hd).sum(), (a, b))
    want = torch.autograd.grad(((torch.tanh(a @ b) + onehot) * hc).sum() + ((a * a).sum(1) * hd).sum(), (a, b))
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w)
    assert torch.autograd.gradcheck(lambda a, b: f(a, b, lab), (a, b))
    (dc,) = torch.autograd.grad(f(a, b, lab)[1].sum(), (b,), allow_unused=True)   # an output that reads no B
    assert dc is None or not dc.any()


def test_torch_op_compiles_without_a_graph_break_and_copies_nothing():
    torch = pytest.importorskip("torch")
    import te_autodiff.torch as tet
    ins, outs = program("float32")
    f = tet.op(ins, outs[0])
    a = torch.randn(n, m, requires_grad=True)
    b = torch.randn(m, p, requires_grad=True)
    lab = torch.zeros(n, dtype=torch.int32)
    step = torch.compile(lambda a, b: (f(a, b, lab) ** 2).sum(), fullgraph=True)
    loss = step(a, b)
    loss.backward()
    ref_a, ref_b = a.detach().clone().requires_grad_(), b.detach().clone().requires_grad_()
    ref = ((torch.tanh(ref_a @ ref_b) + torch.nn.functional.one_hot(lab.long(), p)) ** 2).sum()
    ref.backward()
    torch.testing.assert_close(loss, ref)
    torch.testing.assert_close(a.grad, ref_a.grad)
    torch.testing.assert_close(b.grad, ref_b.grad)
    seen = []
    kernel = f.kernel
    kernel.call_at = lambda addresses: (seen.append(addresses), type(kernel).call_at(kernel, addresses))
    c = f(a, b, lab)                                        # eager: the kernel reads the tensors' memory
    assert seen[0][:3] == [a.data_ptr(), b.data_ptr(), lab.data_ptr()] and seen[0][3] == c.data_ptr()


def test_torch_op_errors_name_the_placeholder():
    torch = pytest.importorskip("torch")
    import te_autodiff.torch as tet
    f = tet.op(*program())
    good = [torch.zeros(n, m, dtype=torch.float64), torch.zeros(m, p, dtype=torch.float64),
            torch.zeros(n, dtype=torch.int32)]
    with pytest.raises(ValueError, match="'B'"):
        f(good[0], torch.zeros(p, m, dtype=torch.float64), good[2])
    with pytest.raises(TypeError, match="'A'"):
        f(good[0].float(), good[1], good[2])
    with pytest.raises(TypeError, match="takes 3 tensors"):
        f(good[0], good[1])


def test_jax_op_under_jit_grad_and_vjp(rng):
    jax = pytest.importorskip("jax")
    import jax.numpy as jnp
    from jax.test_util import check_grads
    import te_autodiff.jax as tej
    jax.config.update("jax_enable_x64", True)
    try:
        f = tej.op(*program())
        a, b = jnp.asarray(rng.standard_normal((n, m))), jnp.asarray(rng.standard_normal((m, p)))
        lab = jnp.asarray(np.arange(n) % p, dtype=jnp.int32)
        onehot = (jnp.arange(p)[None, :] == lab[:, None]).astype(jnp.float64)

        def ref(a, b):
            return jnp.tanh(a @ b) + onehot, jnp.sum(a * a, axis=1)
        for got, want in zip(jax.jit(f)(a, b, lab), ref(a, b)):
            np.testing.assert_allclose(got, want, rtol=1e-12)

        def loss(fn):
            return lambda a, b: jnp.sum(fn(a, b)[0] ** 2) + jnp.sum(fn(a, b)[1])
        got = jax.jit(jax.grad(loss(lambda a, b: f(a, b, lab)), argnums=(0, 1)))(a, b)
        want = jax.grad(loss(ref), argnums=(0, 1))(a, b)
        for g, w in zip(got, want):
            np.testing.assert_allclose(g, w, rtol=1e-10)
        check_grads(lambda a, b: f(a, b, lab)[0], (a, b), order=1, modes=["rev"])
        _, pull = jax.vjp(lambda a: f(a, b, lab)[1], a)
        np.testing.assert_allclose(pull(jnp.ones(n))[0], 2 * a, rtol=1e-12)
        with pytest.raises(ValueError, match="'B'"):
            f(a, jnp.zeros((p, m)), lab)
        with pytest.raises(TypeError, match="'L'"):
            f(a, b, lab.astype(jnp.float64))
    finally:
        jax.config.update("jax_enable_x64", False)
