"""Differential fuzzing of te-autodiff against PyTorch.

Random programs (``programs.py``), each written both as te code and as
PyTorch code from one description (``describe.py``, ``torch_ops.py``), are
built and run in child processes (``runner.py``) and their forward values,
gradients and second-order gradients compared in float64 (``check.py``),
along with the arguments and shapes a kernel must refuse (``bad_inputs.py``).
``python -m fuzz --programs 20000 --seed 0 --jobs 1`` runs an exploration.
"""
