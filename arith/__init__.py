"""Integer linear algebra over opaque index variables (no tensor knowledge).

``linear``: LinearExpr, LinearSystem, Transform, Var; ``smith``: Smith normal
form and the equation solver; ``bounds``: Fourier-Motzkin bounds and exact
OR-tools queries on integer points.
"""

from .linear import LinearExpr, LinearSystem, Transform, Var, as_linear
from .smith import Solution, smith_normal_form, solve_equations
from .bounds import (FMResult, VarBounds, clear_caches, fourier_motzkin, is_feasible,
                     is_implied, normalize_inequality, numeric_bounds)

__all__ = ["LinearExpr", "LinearSystem", "Transform", "Var", "as_linear",
           "Solution", "smith_normal_form", "solve_equations",
           "FMResult", "VarBounds", "fourier_motzkin", "normalize_inequality",
           "numeric_bounds", "is_feasible", "is_implied", "clear_caches"]
