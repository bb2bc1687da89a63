"""One module per GradBench eval, each written with te-autodiff's public API
the way the eval's README states the math.

Every module exposes the eval's functions under GradBench's names (``lse.primal``,
``gmm.jacobian``, ...) as :class:`benchmarks.gradbench.function.Function`
objects, and builds its kernels once per input shape.
"""
from importlib import import_module

#: the evals a te-autodiff module implements, in GradBench's names
EVALS = ("hello", "lse", "llsq", "kmeans", "gmm", "lstm", "ode", "ba")

#: GradBench evals with no module here, and why (README.md says more)
NOT_COVERED = {
    "ht": "its jacobian is the dense 3N x 26 Jacobian of a vector (the N points' errors) through a chain of "
          "tensors (22 bones' transforms along the skeleton, skinning, the global transform); te has "
          "vector-Jacobian products (te.gradient, one reverse pass per output row: 3N passes) and te.jacobian "
          "of one tensor by an input it reads directly, but no forward mode and no Jacobian through a graph",
    "det": "expansion by minors is a recursion over sub-matrices (or a sum over the l! permutations, "
           "whose index needs a sequential Lehmer decoding); neither is an index formula over fixed shapes",
    "particle": "an unbounded while loop (integrate until the particle crosses the x axis) inside "
                "gradient descent until convergence, and forward-mode variants: te has no data-dependent "
                "loops and no forward mode",
    "saddle": "nested gradient descent to convergence (argmin of an argmax) with forward-mode variants: "
              "te has no data-dependent loops and no forward mode",
}


def load(name: str):
    """The module implementing eval ``name``."""
    if name not in EVALS:
        why = NOT_COVERED.get(name)
        raise ValueError(f"no te-autodiff module for GradBench eval {name!r}"
                         + (f": {why}" if why else f"; the covered evals are {', '.join(EVALS)}"))
    return import_module(f"{__name__}.{name}")
