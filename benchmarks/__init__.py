"""te-autodiff benchmark suite: twelve forward + backward kernels against numpy, JAX and PyTorch.

Run it with ``python -m benchmarks``; see ``benchmarks/README.md``.
"""
