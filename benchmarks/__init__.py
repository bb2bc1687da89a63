"""te-autodiff benchmark suite: fourteen forward + backward kernels against numpy, JAX and PyTorch.

Run it with ``python -m benchmarks``; see ``benchmarks/README.md``.
"""
