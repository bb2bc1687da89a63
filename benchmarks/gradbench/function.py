"""A GradBench function as te-autodiff runs it: convert, compute, convert back.

GradBench sends each function its input as JSON and times only the
computation, not the conversion of the input to arrays nor of the result to
JSON (its own Python tools and its C++ ``manual`` tool both work that way).
A :class:`Function` keeps the three steps apart so the te tool
(``tool.py``) can time ``run`` alone, while calling the object does all
three, which is what the tests and a user want.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable


@dataclass(frozen=True)
class Function:
    """``pre`` turns the JSON input into arrays and fetches the compiled
    kernels (building them on first use of a shape), ``run`` computes and
    returns materialised numpy results, ``post`` turns those into the JSON
    value GradBench expects."""

    pre: Callable[[Any], Any]
    run: Callable[[Any], Any]
    post: Callable[[Any], Any]

    def __call__(self, input: Any) -> Any:
        return self.post(self.run(self.pre(input)))


def function(*, pre: Callable[[Any], Any], post: Callable[[Any], Any]):
    """Decorator: the decorated callable becomes ``run`` of a :class:`Function`."""
    def wrap(run: Callable[[Any], Any]) -> Function:
        return Function(pre=pre, run=run, post=post)
    return wrap


def applied(pre: Callable[[Any], Any], post: Callable[[Any], Any]) -> Function:
    """A :class:`Function` whose ``pre`` returns ``(kernel, *arrays)`` and
    whose ``run`` is the kernel applied to the arrays (most evals' functions)."""
    return Function(pre=pre, run=_apply, post=post)


def _apply(prepared):
    kernel, *arrays = prepared
    return kernel(*arrays)


def scalar(result) -> float:
    """A one-element array (te's scalar outputs have shape (1,)) as a JSON number."""
    return float(result.reshape(-1)[0])


def vector(result) -> list:
    """An array as a (nested) JSON list of floats."""
    return result.tolist()
