"""The intrinsic functions of SPEC (``te.exp`` ... ``te.abs``), one line each."""
from .expr import unary


def exp(x):
    """e ** x."""
    return unary("exp", x)


def log(x):
    """Natural logarithm."""
    return unary("log", x)


def log1p(x):
    """log(1 + x), accurate for small x."""
    return unary("log1p", x)


def sqrt(x):
    """Square root."""
    return unary("sqrt", x)


def tanh(x):
    """Hyperbolic tangent."""
    return unary("tanh", x)


def sigmoid(x):
    """1 / (1 + exp(-x))."""
    return unary("sigmoid", x)


def sin(x):
    """Sine."""
    return unary("sin", x)


def cos(x):
    """Cosine."""
    return unary("cos", x)


def abs(x):  # noqa: A001 - the public name is te.abs
    """Absolute value (keeps the dtype)."""
    return unary("abs", x)
