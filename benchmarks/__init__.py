"""te-autodiff benchmark suite: fifteen forward + backward kernels against numpy, JAX and PyTorch.

Run it with ``python -m benchmarks``; see ``benchmarks/README.md``.
"""
