"""Inputs a kernel must refuse, and shapes too large to run.

``bad_input_failures`` calls a built kernel with arguments SPEC says it must
refuse before any native code runs: too few or too many arrays (TypeError
or ValueError), and for each placeholder a wrong dtype (TypeError), a wrong
shape (ValueError) and something that is not an array (TypeError), each
message naming the placeholder; the kernel must then still give the same
bits on the good arguments.

``HUGE`` are programs whose tensors cannot fit in memory (more than 2**31
elements, and more bytes than the machine has or than int64 can count):
``huge_extent_failures`` runs them in a child process (a crash or a hang
there is a failure, not the end of the fuzzer) and checks that the build
and the call end in a MemoryError or ValueError naming the tensor.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numpy as np

OTHER_DTYPE = {"float64": ["float32", "int64"], "int32": ["int64", "float64"], "int64": ["int32", "float32"]}


def _cases(names, arrays, rng):
    """(description, arguments, expected exception types, name the message must contain)."""
    yield "one array too few", arrays[:-1], (TypeError, ValueError), None
    yield "one array too many", arrays + [arrays[0]], (TypeError, ValueError), None
    for k, (name, a) in enumerate(zip(names, arrays)):
        def swap(bad):
            return arrays[:k] + [bad] + arrays[k + 1:]
        dtype = str(rng.choice(OTHER_DTYPE[str(a.dtype)]))
        yield f"'{name}' as {dtype}", swap(a.astype(dtype)), (TypeError,), name
        shapes = [a.shape + (1,)] + ([(a.shape[0] + 1,) + a.shape[1:], a.shape[:-1]] if a.ndim else [])
        shape = shapes[rng.integers(len(shapes))]
        yield f"'{name}' with shape {shape}", swap(np.zeros(shape, a.dtype)), (ValueError,), name
        other = [a.tolist(), None, 3.0, np.float64(1.0), "abc"][rng.integers(5)]
        yield f"'{name}' as {type(other).__name__}", swap(other), (TypeError,), name


def bad_input_failures(kernel, arrays, good, rng) -> list:
    """What went wrong when ``kernel`` (whose good ``arrays`` gave ``good``) was called with bad arguments."""
    names = [t.name for t in kernel.inputs]
    failures = []
    for what, args, expected, name in _cases(names, list(arrays), rng):
        try:
            kernel(*args)
        except expected as e:
            if name is not None and f"'{name}'" not in str(e):
                failures.append(f"{what}: the message does not name '{name}': {e}")
        except Exception as e:           # noqa: BLE001 - any other type is the failure reported
            failures.append(f"{what}: {type(e).__name__} ({e}), expected {'/'.join(x.__name__ for x in expected)}")
        else:
            failures.append(f"{what}: accepted")
    again = kernel(*arrays)
    again = list(again) if isinstance(again, tuple) else [again]
    if not all(np.array_equal(a, b, equal_nan=True) for a, b in zip(again, good)):
        failures.append("after the bad calls, the good arguments give different results")
    return failures


# Each program ends with `outcome = ...`, a call that must raise; `name` is
# the tensor the message must name.  The placeholders themselves are fine: a
# description costs nothing until something is allocated.
HUGE = {
    "output beyond memory": ("Big", """
        A = te.placeholder((4,), "float64", "A")
        Big = te.compute((2**20, 2**20), lambda i, j: A[j % 4] * 2.0, name="Big")
        outcome = te.build([A], [Big])(np.ones(4))"""),
    "output beyond int64 bytes": ("Huge", """
        A = te.placeholder((4,), "float64", "A")
        Huge = te.compute((2**40, 2**40), lambda i, j: A[j % 4] + 1.0, name="Huge")
        outcome = te.build([A], [Huge])(np.ones(4))"""),
    "temporary beyond memory": ("T", """
        A = te.placeholder((4,), "float64", "A")
        T = te.compute((2**20, 2**20), lambda i, j: te.exp(A[(i + j) % 4]), name="T")
        k = te.reduce_axis(2**20, "k")
        B = te.compute((4,), lambda i: te.sum(T[i, k] * T[k, i], axis=k), name="B")
        outcome = te.build([A], [B], store=[T])(np.ones(4))"""),
    "placeholder over 2**31 elements, small array": ("A", """
        A = te.placeholder((2**31 + 1,), "float32", "A")
        B = te.compute((4,), lambda i: A[i] * 2.0, name="B")
        outcome = te.build([A], [B])(np.ones(4, "float32"))"""),
    "placeholder beyond int64 bytes, small array": ("A", """
        A = te.placeholder((2**62, 2**62), "float64", "A")
        B = te.compute((2, 2), lambda i, j: A[i, j] * 2.0, name="B")
        (dA,) = te.gradient(B, [A])
        outcome = te.build([A], [B, dA])(np.ones((2, 2)))"""),
}

_CHILD = """
import json, resource, sys
import numpy as np
import te_autodiff as te
resource.setrlimit(resource.RLIMIT_AS, ({limit}, {limit}))    # a runaway allocation fails here
{programs}
"""

_PROGRAM = """
try:
{body}
    print(json.dumps({{"raised": None}}), flush=True)
except Exception as e:
    print(json.dumps({{"raised": type(e).__name__, "message": str(e)}}), flush=True)
"""


def huge_extent_failures(timeout: float = 300.0) -> list:
    """Failures of the ``HUGE`` programs, run in one child process with its
    address space capped at 16 GiB (one JSON line per program)."""
    programs = "".join(_PROGRAM.format(body=textwrap.indent(textwrap.dedent(body).strip(), "    "))
                       for _, body in HUGE.values())
    code = _CHILD.format(limit=16 << 30, programs=programs)
    try:
        p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout,
                           env=dict(os.environ, TE_NUM_THREADS="1"))
        lines, died = p.stdout.strip().splitlines(), f"the process died (exit {p.returncode}): {p.stderr[-800:]}"
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode() if isinstance(e.stdout, bytes) else e.stdout or ""
        lines, died = out.strip().splitlines(), f"no answer in {timeout:.0f} s (a hang)"
    failures = []
    for k, (what, (name, _)) in enumerate(HUGE.items()):
        if k >= len(lines):
            failures.append(f"{what}: {died}")
            continue
        got = json.loads(lines[k])
        if got["raised"] not in ("MemoryError", "ValueError"):
            failures.append(f"{what}: expected MemoryError or ValueError naming '{name}', got {got}")
        elif f"'{name}'" not in got["message"]:
            failures.append(f"{what}: the message does not name '{name}': {got['message']}")
    return failures
