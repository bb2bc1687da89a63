"""The fuzzer's own checks, which need no oracle (tests/test_fuzz.py runs its programs against torch).

* The checks can fail: a kernel that accepts anything fails the bad-argument
  check, a wrong value fails the comparison.
* Shapes far beyond memory (and beyond int64 bytes) are refused with a
  MemoryError or ValueError naming the tensor, each in a child process.
"""
import numpy as np

import te_autodiff as te
from fuzz.bad_inputs import bad_input_failures, huge_extent_failures
from fuzz.check import compare

F64 = "float64"


def _kernel():
    A = te.placeholder((3, 4), F64, "Alpha")
    B = te.placeholder((4,), "int32", "Beta")
    C = te.compute((3, 4), lambda i, j: A[i, j] * 2.0 + B[j].astype(F64), name="C")
    arrays = [np.ones((3, 4)), np.arange(4, dtype=np.int32)]
    kernel = te.build([A, B], [C])
    return kernel, arrays, [kernel(*arrays)]


def test_bad_arguments_are_refused_naming_the_placeholder():
    kernel, arrays, good = _kernel()
    for seed in range(5):
        assert bad_input_failures(kernel, arrays, good, np.random.default_rng(seed)) == []


def test_the_bad_argument_check_catches_a_kernel_that_accepts_anything():
    kernel, arrays, good = _kernel()

    class Permissive:
        inputs = kernel.inputs

        def __call__(self, *args):
            return good[0]

    failures = bad_input_failures(Permissive(), arrays, good, np.random.default_rng(0))
    assert len(failures) == 2 + 3 * len(arrays) and all(f.endswith("accepted") for f in failures)


def test_the_comparison_catches_a_wrong_value_and_a_leaked_nan():
    want = np.array([1.0, np.nan, np.inf, 2.0])
    assert compare(["Y"], [want.copy()], [want], nonfinite=True) is None
    assert "Y[0]" in compare(["Y"], [want + [1e-6, 0, 0, 0]], [want], nonfinite=True)
    assert "Y[3]" in compare(["Y"], [np.array([1.0, np.nan, np.inf, np.nan])], [want], nonfinite=True)
    assert "not finite" in compare(["Y"], [want], [want])


def test_huge_extents_are_refused_cleanly():
    assert huge_extent_failures() == []
