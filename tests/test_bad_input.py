"""Bad input, everywhere a user can give it.

``TABLE`` lists every argument of every public function and method of
SPEC.md with a wrong value, the exact exception type it raises and a
fragment of its message, which names the offending tensor, axis, argument
or environment variable.  ``test_bad_input`` checks each row; a row with an
``env`` runs in a child process (with those environment variables), as do
the rows whose input once crashed the process, so a regression fails one
test instead of aborting the run.  README.md ("Bad input") summarises the
rules and points here: this table is the reference.
"""
import functools
import importlib
import json
import os
import re
import subprocess
import sys
from typing import NamedTuple

import numpy as np
import pytest

import te_autodiff as te

CHILD = {}                       # a child process, the environment as inherited
_AARCH64 = "aarch64-unknown-linux-gnu:neoverse-n1"


class Row(NamedTuple):
    """``code`` (a Python expression over :func:`fixtures`) must raise exactly
    ``exc`` with ``fragment`` in its message."""

    api: str                     # the public function or method
    arg: str                     # the argument given a wrong value
    code: str
    exc: type
    fragment: str
    env: dict | None = None      # None: in this process; else a child with these variables


R = Row                          # short, for the table
TABLE = [
    # ------------------------------------------------------------ te.placeholder
    R("te.placeholder", "shape", "te.placeholder(None, 'float32', 'Z')",
      TypeError, "'Z': shape must be"),
    R("te.placeholder", "shape", "te.placeholder((3.0, 4), 'float32', 'Z')",
      TypeError, "'Z': shape entries must be ints"),
    R("te.placeholder", "shape", "te.placeholder((True, 4), 'float32', 'Z')",
      TypeError, "'Z': shape entries must be ints"),
    R("te.placeholder", "shape", "te.placeholder((3, -1), 'float32', 'Z')",
      ValueError, "'Z': shape entries must be non-negative"),
    R("te.placeholder", "shape", "te.placeholder((2**63,), 'float32', 'Z')",
      ValueError, "'Z': shape entries must be below 2**63"),
    R("te.placeholder", "dtype", "te.placeholder((3,), 'complex64', 'Z')",
      TypeError, "'Z': unsupported dtype 'complex64'"),
    R("te.placeholder", "dtype", "te.placeholder((3,), 'float16', 'Z')",
      TypeError, "'Z': unsupported dtype 'float16'"),
    R("te.placeholder", "dtype", "te.placeholder((3,), np.uint8, 'Z')",
      TypeError, "'Z': unsupported dtype"),
    R("te.placeholder", "dtype", "te.placeholder((3,), None, 'Z')",
      TypeError, "'Z': unsupported dtype None"),
    R("te.placeholder", "name", "te.placeholder((3,), 'float32', 5)",
      TypeError, "te.placeholder: name must be a str"),
    R("te.placeholder", "name", "te.placeholder((3,), 'float32', 'Z\\n')",
      ValueError, "te.placeholder: name 'Z\\n' has a non-printable"),
    # ------------------------------------------------------------ te.compute
    R("te.compute", "shape", "te.compute('3', lambda i: A[i, 0], name='Z')",
      TypeError, "te.compute 'Z': shape entries must be ints"),
    R("te.compute", "shape", "te.compute((-3,), lambda i: A[i, 0], name='Z')",
      ValueError, "te.compute 'Z': shape entries must be non-negative"),
    R("te.compute", "fcompute", "te.compute((3,), None, name='Z')",
      TypeError, "te.compute 'Z': fcompute must be a function"),
    R("te.compute", "fcompute", "te.compute((3, 4), lambda i: A[i, 0], name='Z')",
      TypeError, "'Z': fcompute takes 1 index argument(s) but the shape has 2"),
    R("te.compute", "fcompute", "te.compute((3,), lambda i, j: A[i, j], name='Z')",
      TypeError, "'Z': fcompute takes 2 index argument(s) but the shape has 1"),
    R("te.compute", "fcompute", "te.compute((3, 4), lambda i, j: A, name='Z')",
      TypeError, "'Z': fcompute returned tensor 'A'"),
    R("te.compute", "fcompute", "te.compute((3,), lambda i: 'x', name='Z')",
      TypeError, "te.compute 'Z': cannot use 'x'"),
    R("te.compute", "fcompute", "te.compute((3,), lambda i: [A[i, 0]], name='Z')",
      TypeError, "'Z': fcompute must return one scalar expression"),
    R("te.compute", "fcompute", "te.compute((3,), lambda i: A[i, C.axes[1]], name='Z')",
      ValueError, "'Z': variable 'c' is not in scope"),
    R("te.compute", "name", "te.compute((3,), lambda i: A[i, 0], name=None)",
      TypeError, "te.compute: name must be a str"),
    R("te.compute", "name", "te.build([A], [te.compute((3,), lambda i: A[i, 0], name='Z\\x00')])",
      ValueError, "te.compute: name 'Z\\x00' has a non-printable", CHILD),
    # ------------------------------------------------------------ te.reduce_axis
    R("te.reduce_axis", "dom", "te.reduce_axis('4', 'r')",
      TypeError, "te.reduce_axis 'r': dom must be an int or (begin, end)"),
    R("te.reduce_axis", "dom", "te.reduce_axis(2.5, 'r')",
      TypeError, "te.reduce_axis 'r': dom must be"),
    R("te.reduce_axis", "dom", "te.reduce_axis((0.5, 2.5), 'r')",
      TypeError, "te.reduce_axis 'r': dom must be"),
    R("te.reduce_axis", "dom", "te.reduce_axis((0, 2, 3), 'r')",
      TypeError, "te.reduce_axis 'r': dom must be"),
    R("te.reduce_axis", "dom", "te.reduce_axis((5, 2), 'r')",
      ValueError, "te.reduce_axis 'r': range [5, 2) ends before it begins"),
    R("te.reduce_axis", "dom", "te.reduce_axis(-1, 'r')",
      ValueError, "te.reduce_axis 'r': range [0, -1) ends before"),
    R("te.reduce_axis", "dom", "te.reduce_axis(2**63, 'r')",
      ValueError, "te.reduce_axis 'r': range [0, 9223372036854775808) does not fit int64"),
    R("te.reduce_axis", "name", "te.reduce_axis(4, 7)",
      TypeError, "te.reduce_axis: name must be a str"),
    R("te.reduce_axis", "name", "te.reduce_axis(4, 'r\\x00')",
      ValueError, "te.reduce_axis: name 'r\\x00' has a non-printable", CHILD),
    # ------------------------------------------------------------ reductions
    R("te.sum", "axis", "te.compute((3,), lambda i: te.sum(A[i, k], axis=3), name='Z')",
      TypeError, "te.sum: axis must be te.reduce_axis variables, got 3"),
    R("te.sum", "axis", "te.compute((3,), lambda i: te.sum(A[i, 0], axis=i), name='Z')",
      ValueError, "'Z': the reduction runs over 'i', an axis of this tensor"),
    R("te.sum", "expr", "te.compute((3,), lambda i: te.sum(A, axis=k), name='Z')",
      TypeError, "cannot use Tensor('A'"),
    R("te.sum", "where", "te.compute((3,), lambda i: te.sum(A[i, k], axis=k, where=A[i, k]), name='Z')",
      TypeError, "te.sum where= needs bool conditions, got float64"),
    R("te.max", "axis", "te.compute((3,), lambda i: te.max(A[i, k], axis=[]), name='Z')",
      ValueError, "te.max: axis must name at least one"),
    R("te.max", "axis", "te.compute((3,), lambda i: te.sum(A[i, k], axis=k) + te.max(A[i, k], axis=k), name='Z')",
      ValueError, "'Z': reduce axis 'k' is used by two reductions"),
    R("te.min", "axis", "te.compute((3,), lambda i: te.min(A[i, k], axis=[k, k]), name='Z')",
      ValueError, "te.min: axis lists the same reduce axis twice"),
    R("te.min", "axis", "te.compute((3,), lambda i: A[i, k], name='Z')",
      ValueError, "'Z': variable 'k' is not in scope"),
    R("te.prod", "expr", "te.compute((3,), lambda i: te.prod('x', axis=k), name='Z')",
      TypeError, "cannot use 'x'"),
    R("te.prod", "axis", "te.compute((3,), lambda i: te.prod(A[i, k], axis=None), name='Z')",
      TypeError, "te.prod: axis must be te.reduce_axis variables, got None"),
    # ------------------------------------------------------------ conditions
    R("te.if_then_else", "cond", "te.compute((3,), lambda i: te.if_then_else(A[i, 0] == 0.0, 1.0, 0.0), name='Z')",
      TypeError, "te.if_then_else got a Python bool"),
    R("te.if_then_else", "cond", "te.compute((3,), lambda i: te.if_then_else(A[i, 0], 1.0, 0.0), name='Z')",
      TypeError, "if_then_else needs bool conditions, got float64"),
    R("te.if_then_else", "a", "te.compute((3,), lambda i: te.if_then_else(i < 2, 'a', 0.0), name='Z')",
      TypeError, "cannot use 'a'"),
    R("te.if_then_else", "b", "te.compute((3,), lambda i: te.if_then_else(i < 2, 0.0, A), name='Z')",
      TypeError, "cannot use Tensor('A'"),
    R("te.select", "cond", "te.compute((3,), lambda i: te.select(I[i], 1.0, 0.0), name='Z')",
      TypeError, "if_then_else needs bool conditions, got int32"),
    R("te.all", "conds", "te.compute((3,), lambda i: te.if_then_else(te.all(i, i < 2), 1.0, 0.0), name='Z')",
      TypeError, "te.all needs bool conditions, got int64"),
    R("te.any", "conds", "te.compute((3,), lambda i: te.if_then_else(te.any(A[i, 0], i < 2), 1.0, 0.0), name='Z')",
      TypeError, "te.any needs bool conditions, got float64"),
    R("te.not_", "cond", "te.compute((3,), lambda i: te.if_then_else(te.not_(i), 1.0, 0.0), name='Z')",
      TypeError, "te.not_ needs bool conditions, got int64"),
    R("te.equal", "b", "te.equal(A[0, 0], A)",
      TypeError, "cannot use Tensor('A'"),
    R("te.not_equal", "a", "te.not_equal('x', A[0, 0])",
      TypeError, "cannot use 'x'"),
    R("Expr.__bool__", "self", "bool(A[0, 0] > 0.0)",
      TypeError, "a tensor expression has no Python truth value"),
    # ------------------------------------------------------------ scalar operators, constants, casts
    R("Expr.__truediv__", "other", "te.compute((3,), lambda i: I[i] / 2, name='Z')",
      TypeError, "'/' is true division and needs a float operand (got int32"),
    R("Expr.__neg__", "self", "te.compute((3,), lambda i: -(i < 2), name='Z')",
      TypeError, "cannot negate a bool expression"),
    R("Expr.__add__", "other", "te.compute((3,), lambda i: A[i, 0] + None, name='Z')",
      TypeError, "cannot use None"),
    R("Expr.__add__", "other", "te.compute((3,), lambda i: I[i] + 2**40, name='Z')",
      ValueError, "constant 1099511627776 does not fit int32"),
    R("Expr.__mul__", "other", "te.compute((3,), lambda i: A[i, 0] * np.ones(3), name='Z')",
      TypeError, "cannot use array("),
    R("Expr.astype", "dtype", "A[0, 0].astype('complex64')",
      TypeError, "unsupported dtype 'complex64'"),
    R("Expr.astype", "dtype", "A[0, 0].astype(None)",
      TypeError, "unsupported dtype None"),
    R("te.maximum", "b", "te.maximum(A[0, 0], A)",
      TypeError, "cannot use Tensor('A'"),
    R("te.minimum", "a", "te.minimum(None, A[0, 0])",
      TypeError, "cannot use None"),
    R("te.power", "b", "te.power(A[0, 0], 'two')",
      TypeError, "cannot use 'two'"),
    R("te.const", "value", "te.const('x')",
      TypeError, "cannot use 'x'"),
    R("te.const", "value", "te.const('x', 'float32')",
      TypeError, "cannot use 'x'"),
    R("te.const", "value", "te.const(None, 'int32')",
      TypeError, "cannot use None"),
    R("te.const", "value", "te.const(1.5, 'int32')",
      TypeError, "constant 1.5 is not an integer but dtype is int32"),
    R("te.const", "value", "te.const(2**40, 'int32')",
      ValueError, "constant 1099511627776 does not fit int32"),
    R("te.const", "value", "te.const(2**70)",
      ValueError, "constant 1180591620717411303424 does not fit int64"),
    R("te.const", "dtype", "te.const(1, 'complex64')",
      TypeError, "unsupported dtype 'complex64'"),
    # ------------------------------------------------------------ intrinsics
    R("te.exp", "x", "te.exp('x')",
      TypeError, "cannot use 'x'"),
    R("te.log", "x", "te.log(A)",
      TypeError, "cannot use Tensor('A'"),
    R("te.log1p", "x", "te.log1p(None)",
      TypeError, "cannot use None"),
    R("te.sqrt", "x", "te.compute((3,), lambda i: te.sqrt(i < 2), name='Z')",
      TypeError, "te.sqrt needs a numeric argument, got a bool"),
    R("te.tanh", "x", "te.tanh(np.ones(3))",
      TypeError, "cannot use array("),
    R("te.sigmoid", "x", "te.compute((3,), lambda i: te.sigmoid(A[i, 0] > 0.0), name='Z')",
      TypeError, "te.sigmoid needs a numeric argument"),
    R("te.sin", "x", "te.sin([1.0])",
      TypeError, "cannot use [1.0]"),
    R("te.cos", "x", "te.cos(1j)",
      TypeError, "cannot use 1j"),
    R("te.abs", "x", "te.compute((3,), lambda i: te.abs(i < 2), name='Z')",
      TypeError, "te.abs needs a numeric argument"),
    R("te.erf", "x", "te.erf('x')",
      TypeError, "cannot use 'x'"),
    R("te.erfc", "x", "te.erfc(A)",
      TypeError, "cannot use Tensor('A'"),
    R("te.expm1", "x", "te.expm1(None)",
      TypeError, "cannot use None"),
    R("te.exp2", "x", "te.compute((3,), lambda i: te.exp2(i < 2), name='Z')",
      TypeError, "te.exp2 needs a numeric argument, got a bool"),
    R("te.log2", "x", "te.log2([2.0])",
      TypeError, "cannot use [2.0]"),
    R("te.log10", "x", "te.log10(1j)",
      TypeError, "cannot use 1j"),
    R("te.rsqrt", "x", "te.rsqrt(np.ones(3))",
      TypeError, "cannot use array("),
    R("te.tan", "x", "te.tan('x')",
      TypeError, "cannot use 'x'"),
    R("te.atan", "x", "te.atan(A)",
      TypeError, "cannot use Tensor('A'"),
    R("te.asin", "x", "te.asin(None)",
      TypeError, "cannot use None"),
    R("te.acos", "x", "te.compute((3,), lambda i: te.acos(A[i, 0] > 0.0), name='Z')",
      TypeError, "te.acos needs a numeric argument"),
    R("te.sinh", "x", "te.sinh([1.0])",
      TypeError, "cannot use [1.0]"),
    R("te.cosh", "x", "te.cosh(1j)",
      TypeError, "cannot use 1j"),
    R("te.floor", "x", "te.floor('x')",
      TypeError, "cannot use 'x'"),
    R("te.ceil", "x", "te.ceil(A)",
      TypeError, "cannot use Tensor('A'"),
    R("te.round", "x", "te.round(None)",
      TypeError, "cannot use None"),
    R("te.trunc", "x", "te.trunc(np.ones(3))",
      TypeError, "cannot use array("),
    R("te.sign", "x", "te.compute((3,), lambda i: te.sign(i < 2), name='Z')",
      TypeError, "te.sign needs a numeric argument, got a bool"),
    R("te.atan2", "x", "te.atan2(A[0, 0], 'x')",
      TypeError, "cannot use 'x'"),
    R("te.atan2", "y", "te.atan2(A[0, 0])",
      TypeError, "te.atan2 takes 2 arguments, got 1"),
    R("te.clip", "lo", "te.clip(A[0, 0], A, 1.0)",
      TypeError, "cannot use Tensor('A'"),
    R("te.clip", "hi", "te.clip(A[0, 0], 0.0)",
      TypeError, "te.clip takes 3 arguments, got 2"),
    # ------------------------------------------------------------ Tensor: indexing and attributes
    R("Tensor.__getitem__", "indices", "A[0]",
      IndexError, "tensor 'A' has 2 dimension(s) but was indexed with 1"),
    R("Tensor.__getitem__", "indices", "A[0, 0, 0]",
      IndexError, "tensor 'A' has 2 dimension(s) but was indexed with 3"),
    R("Tensor.__getitem__", "indices", "A[0.5, 0]",
      TypeError, "tensor 'A': index 0 has dtype float32"),
    R("Tensor.__getitem__", "indices", "te.compute((3,), lambda i: A[i, i < 2], name='Z')",
      TypeError, "tensor 'A': index 1 has dtype bool"),
    R("Tensor.__getitem__", "indices", "te.compute((3,), lambda i: A[i, A[i, 0]], name='Z')",
      TypeError, "tensor 'A': index 1 has dtype float64"),
    R("Tensor.__getitem__", "indices", "A['a', 0]",
      TypeError, "tensor 'A': index 0: cannot use 'a'"),
    R("Tensor.__getitem__", "indices", "A[:, 0]",
      TypeError, "tensor 'A': slices are not supported"),
    R("Tensor.__getitem__", "indices", "A[I, 0]",
      TypeError, "tensor 'A': index 0: cannot use Tensor('I'"),
    R("Tensor.__getitem__", "indices", "A[0, 2**70]",
      ValueError, "tensor 'A': index 1: constant 1180591620717411303424 does not fit int64"),
    R("Tensor.__getitem__", "indices", "te.build([A], [te.compute((3,), lambda i: A[i, 4], name='Z')])",
      IndexError, "tensor 'Z' reads 'A' out of bounds: dimension 1"),
    R("Tensor.__getitem__", "indices", "te.build([A], [te.compute((3,), lambda i: A[i + 1, 0], name='Z')])",
      IndexError, "tensor 'Z' reads 'A' out of bounds: dimension 0"),
    R("Tensor.__iter__", "self", "list(A)",
      TypeError, "tensor 'A' is not iterable"),
    R("Tensor.__len__", "self", "len(S)",
      TypeError, "tensor 'S' is 0-dimensional"),
    R("Tensor attributes", "name", "setattr(A, 'name', 'B')",
      AttributeError, "tensors are immutable"),
    # ------------------------------------------------------------ te.gradient
    R("te.gradient", "output", "te.gradient(np.ones(3), [A])",
      TypeError, "te.gradient: output must be a te tensor, got ndarray"),
    R("te.gradient", "inputs", "te.gradient(C, None)",
      TypeError, "te.gradient: inputs must be a te tensor or a list of them, got NoneType"),
    R("te.gradient", "inputs", "te.gradient(C, ['A'])",
      TypeError, "te.gradient: inputs[0] must be a te tensor, got str"),
    R("te.gradient", "inputs", "te.gradient(C, [A[0, 0]])",
      TypeError, "te.gradient: inputs[0] must be a te tensor, got Load"),
    R("te.gradient", "head", "te.gradient(C, [A], head=np.ones((3, 4)))",
      TypeError, "te.gradient: head must be a te tensor, got ndarray"),
    R("te.gradient", "head", "te.gradient(C, [A], head=te.placeholder((4, 3), 'float64', 'H'))",
      ValueError, "head 'H' has shape (4, 3) but output 'C' has shape (3, 4)"),
    R("te.gradient", "optimize", "te.gradient(C, [A], optimize='no')",
      TypeError, "te.gradient: optimize must be True or False, got 'no'"),
    R("te.gradient", "store", "te.gradient(C, [A], store=[C])",
      TypeError, "unexpected keyword argument 'store'"),
    # ------------------------------------------------------------ te.jacobian
    R("te.jacobian", "output", "te.jacobian(np.ones(3), A)",
      TypeError, "te.jacobian: output must be a te tensor"),
    R("te.jacobian", "input", "te.jacobian(C, [A])",
      TypeError, "te.jacobian: input must be a te tensor, got list"),
    R("te.jacobian", "input", "te.jacobian(C, B)",
      ValueError, "te.jacobian: 'C' does not read 'B' directly"),
    R("te.jacobian", "optimize", "te.jacobian(C, A, optimize='x')",
      TypeError, "te.jacobian: optimize must be True or False"),
    # ------------------------------------------------------------ te.pretty
    R("te.pretty", "tensors", "te.pretty(None)",
      TypeError, "te.pretty: expected a te tensor or a list of them, got NoneType"),
    R("te.pretty", "tensors", "te.pretty([C, 3])",
      TypeError, "te.pretty: expected a te tensor or a list of them, got int"),
    R("te.pretty", "tensors", "te.pretty(A[0, 0] + 1.0)",
      TypeError, "te.pretty: expected a te tensor or a list of them, got BinOp"),
    # ------------------------------------------------------------ te.build
    R("te.build", "inputs", "te.build(None, [C])",
      TypeError, "te.build: inputs must be tensors, got None"),
    R("te.build", "inputs", "te.build([A, I, C], [C])",
      TypeError, "te.build: input 'C' is a compute tensor"),
    R("te.build", "inputs", "te.build([A, I, A], [C])",
      ValueError, "te.build: placeholder 'A' is listed twice"),
    R("te.build", "inputs", "te.build([A], [C])",
      ValueError, "te.build: the outputs read placeholder 'I'"),
    R("te.build", "outputs", "te.build([A, I], [])",
      ValueError, "te.build: no outputs given"),
    R("te.build", "outputs", "te.build([A, I], [A[0, 0]])",
      TypeError, "te.build: outputs must be tensors, got <Load A[0, 0]>"),
    R("te.build", "name", "te.build([A, I], [C], name=5)",
      TypeError, "te.build: name must be a str, got 5"),
    R("te.build", "name", "te.build([A, I], [C], name='f\\x00')",
      ValueError, "te.build: name 'f\\x00' has a non-printable", CHILD),
    R("te.build", "target", "te.build([A, I], [C], target='pentium9')",
      ValueError, "unknown target 'pentium9'"),
    R("te.build", "target", "te.build([A, I], [C], target=5)",
      TypeError, "target must be a CPU name or a te.Target, got int"),
    R("te.build", "target", "te.build([A, I], [C], target='aarch64-unknown-linux-gnu:haswell')",
      ValueError, "CPU 'haswell' is not a aarch64 CPU"),
    R("te.build", "store", "te.build([A, I], [C], store=3)",
      TypeError, "te.build: store= must list tensors, got 3"),
    R("te.build", "store", "te.build([A, I], [C], store=['C'])",
      TypeError, "te.build: store= must list tensors, got 'C'"),
    R("te.build", "store", "te.build([A, I], [C], store=[B])",
      ValueError, "te.build: store= names tensor 'B', which the outputs do not depend on"),
    R("te.build", "recompute", "te.build([A, I], [C], recompute=[C])",
      ValueError, "cannot recompute 'C': it is an output"),
    R("te.build", "recompute", "te.build([A, I], [C], recompute=[A])",
      ValueError, "cannot recompute 'A': it is an input placeholder"),
    R("te.build", "recompute", "te.build([A], [Rd2], recompute=[Rd])",
      ValueError, "cannot recompute 'Rd': it is a reduction"),
    R("te.build", "recompute", "te.build([A], [Sq2], store=[Sq], recompute=[Sq])",
      ValueError, "tensor 'Sq' is listed in both store= and recompute="),
    # ------------------------------------------------------------ te.cost (te.build's checks)
    R("te.cost", "inputs", "te.cost([C], [C])",
      TypeError, "te.build: input 'C' is a compute tensor"),
    R("te.cost", "outputs", "te.cost([A, I], 'C')",
      TypeError, "te.build: outputs must be tensors, got 'C'"),
    R("te.cost", "store", "te.cost([A, I], [C], store=[1])",
      TypeError, "te.build: store= must list tensors, got 1"),
    R("te.cost", "recompute", "te.cost([A], [Rd2], recompute=[Rd])",
      ValueError, "cannot recompute 'Rd'"),
    R("te.cost", "target", "te.cost([A, I], [C], target='pentium9')",
      ValueError, "unknown target 'pentium9'"),
    # ------------------------------------------------------------ te.target
    R("te.target", "name", "te.target('pentium9')",
      ValueError, "unknown target 'pentium9'"),
    R("te.target", "name", "te.target('Haswell')",
      ValueError, "unknown target 'Haswell'"),
    R("te.target", "name", "te.target('')",
      ValueError, "unknown target ''"),
    R("te.target", "name", "te.target(5)",
      TypeError, "target must be a CPU name or a te.Target, got int"),
    # ------------------------------------------------------------ te.check_gradient
    R("te.check_gradient", "output", "te.check_gradient(3, [A], [a])",
      TypeError, "te.check_gradient: output must be a te tensor"),
    R("te.check_gradient", "inputs", "te.check_gradient(Sq, [3], [a])",
      TypeError, "te.check_gradient: inputs[0] must be a te tensor"),
    R("te.check_gradient", "values", "te.check_gradient(Sq, [A], [])",
      ValueError, "te.check_gradient: 1 inputs but 0 values"),
    R("te.check_gradient", "values", "te.check_gradient(Sq, [A], ['x'])",
      TypeError, "te.check_gradient: the value for 'A' is not an array of numbers"),
    R("te.check_gradient", "values", "te.check_gradient(Sq, [A], [a.T])",
      ValueError, "placeholder 'A' has shape (3, 4), got an array of shape (4, 3)"),
    R("te.check_gradient", "values", "te.check_gradient(Sq, [A], [np.full((3, 4), np.nan)])",
      AssertionError, "gradient of 'A' at (0, 0)"),
    R("te.check_gradient", "head", "te.check_gradient(Sq, [A], [a], head=np.ones(3))",
      ValueError, "placeholder 'head' has shape (3, 4)"),
    R("te.check_gradient", "rtol", "te.check_gradient(Sq, [A], [a], rtol=-1)",
      ValueError, "needs rtol >= 0, atol >= 0 and eps > 0, got rtol=-1"),
    R("te.check_gradient", "atol", "te.check_gradient(Sq, [A], [a], atol=-1e-6)",
      ValueError, "got rtol=0.0001, atol=-1e-06"),
    R("te.check_gradient", "eps", "te.check_gradient(Sq, [A], [a], eps=0)",
      ValueError, "eps=0"),
    # ------------------------------------------------------------ Kernel.__call__
    R("Kernel.__call__", "arrays", "kernel()(a)",
      TypeError, "kernel 'C' takes 2 array(s) ('A', 'I'), got 1"),
    R("Kernel.__call__", "arrays", "kernel()(a, i, i)",
      TypeError, "kernel 'C' takes 2 array(s) ('A', 'I'), got 3"),
    R("Kernel.__call__", "arrays", "kernel()(A=a, I=i)",
      TypeError, "unexpected keyword argument 'A'"),
    R("Kernel.__call__", "arrays", "kernel()(a.tolist(), i)",
      TypeError, "placeholder 'A' needs a numpy.ndarray, got list"),
    R("Kernel.__call__", "arrays", "kernel()(a, np.int32(1))",
      TypeError, "placeholder 'I' needs a numpy.ndarray, got int32"),
    R("Kernel.__call__", "arrays",
      "kernel()(np.ma.masked_less(a, 0.5), i)",
      TypeError,
      "placeholder 'A' needs a numpy.ndarray, got MaskedArray (a masked array: its mask would be ignored)"),
    R("Kernel.__call__", "arrays", "kernel()(torch.ones(3, 4, dtype=torch.float64), i)",
      TypeError, "placeholder 'A' needs a numpy.ndarray, got Tensor"),
    R("Kernel.__call__", "arrays", "kernel()(a.T, i)",
      ValueError, "placeholder 'A' has shape (3, 4), got an array of shape (4, 3)"),
    R("Kernel.__call__", "arrays", "kernel()(a, i[:, None])",
      ValueError, "placeholder 'I' has shape (3,), got an array of shape (3, 1)"),
    R("Kernel.__call__", "arrays", "kernel()(a.astype('float32'), i)",
      TypeError, "placeholder 'A' has dtype float64, got an array of dtype float32"),
    R("Kernel.__call__", "arrays", "kernel()(a.astype('>f8'), i)",
      TypeError, "placeholder 'A' has dtype float64, got an array of dtype >f8"),
    R("Kernel.__call__", "arrays", "kernel()(a, i.astype('int64'))",
      TypeError, "placeholder 'I' has dtype int32, got an array of dtype int64"),
    R("Kernel.__call__", "arrays", "kernel()(a.astype(object), i)",
      TypeError, "placeholder 'A' has dtype float64, got an array of dtype object"),
    R("Kernel.__call__", "arrays", "te.build([T, J], [G])(np.arange(5.0), np.array([0, 5, 1], np.int32))",
      IndexError, "index 5 is out of bounds for dimension 0 of tensor 'T' (extent 5)"),
    R("Kernel.__call__", "arrays", "te.build([T, J], [G])(np.arange(5.0), np.array([0, -1, 1], np.int32))",
      IndexError, "index -1 is out of bounds for dimension 0 of tensor 'T'"),
    R("Kernel.__call__", "self", f"te.build([A, I], [C], target='{_AARCH64}')(a, i)",
      RuntimeError, f"built for target '{_AARCH64}' (neoverse-n1) and cannot run here"),
    R("Kernel.profile", "arrays", "kernel().profile(a.T, i)",
      ValueError, "placeholder 'A' has shape (3, 4), got an array of shape (4, 3)"),
    R("Kernel.profile", "arrays", "kernel().profile(a)",
      TypeError, "kernel 'C' takes 2 array(s) ('A', 'I'), got 1"),
    R("Kernel.profile", "repeat", "kernel().profile(a, i, repeat=0)",
      ValueError, "kernel 'C'.profile: repeat must be a positive integer, got 0"),
    R("Kernel.profile", "repeat", "kernel().profile(a, i, repeat=2.0)",
      ValueError, "kernel 'C'.profile: repeat must be a positive integer, got 2.0"),
    R("Kernel.profile", "arrays", "te.build([T, J], [G]).profile(np.arange(5.0), np.array([0, 5, 1], np.int32))",
      IndexError, "index 5 is out of bounds for dimension 0 of tensor 'T' (extent 5)"),
    R("Kernel.profile", "self", f"te.build([A, I], [C], target='{_AARCH64}').profile(a, i)",
      RuntimeError, f"built for target '{_AARCH64}' (neoverse-n1) and cannot run here"),
    # ------------------------------------------------------------ Kernel attributes
    R("Kernel attributes", "inputs", "setattr(kernel(), 'inputs', [])",
      AttributeError, "property 'inputs' of 'Kernel' object has no setter", CHILD),
    R("Kernel attributes", "inputs", "(kernel().inputs.clear(), kernel()())",
      TypeError, "kernel 'C' takes 2 array(s)", CHILD),
    R("Kernel attributes", "outputs", "setattr(kernel(), 'outputs', [])",
      AttributeError, "property 'outputs' of 'Kernel' object has no setter"),
    R("Kernel attributes", "asm", "setattr(kernel(), 'asm', '')",
      AttributeError, "property 'asm' of 'Kernel' object has no setter"),
    # ------------------------------------------------------------ te_autodiff.torch.op
    R("te_autodiff.torch.op", "inputs", "tet.op([A, 3], C)",
      TypeError, "te_autodiff.torch.op: inputs must be te tensors, got 3"),
    R("te_autodiff.torch.op", "outputs", "tet.op([A, I], None)",
      TypeError, "te_autodiff.torch.op: outputs must be te tensors, got None"),
    R("te_autodiff.torch.op", "outputs", "tet.op([A, I], [])",
      ValueError, "te_autodiff.torch.op: no outputs given"),
    R("te_autodiff.torch.op", "name", "tet.op([A, I], C, name=5)",
      TypeError, "te.build: name must be a str"),
    R("te_autodiff.torch.op call", "tensors", "torch_op()(torch.ones(3, 4, dtype=torch.float64))",
      TypeError, "te op 'C' takes 2 tensors (A, I), got 1"),
    R("te_autodiff.torch.op call", "tensors", "torch_op()(a, torch.from_numpy(i))",
      TypeError, "te op: input 'A' must be a torch tensor, got ndarray"),
    R("te_autodiff.torch.op call", "tensors",
      "torch_op()(torch.ones(4, 3, dtype=torch.float64), torch.from_numpy(i))",
      ValueError, "input 'A' has shape (3, 4), got a tensor of shape (4, 3)"),
    R("te_autodiff.torch.op call", "tensors", "torch_op()(torch.ones(3, 4), torch.from_numpy(i))",
      TypeError, "input 'A' must be a dense tensor of dtype float64, got torch.float32"),
    R("te_autodiff.torch.op call", "tensors", "torch_op()(torch.ones(3, 4, dtype=torch.float64), torch.arange(3))",
      TypeError, "input 'I' must be a dense tensor of dtype int32, got torch.int64"),
    R("te_autodiff.torch.op call", "tensors",
      "torch_op()(torch.ones(3, 4, dtype=torch.bfloat16), torch.from_numpy(i))",
      TypeError, "input 'A' must be a dense tensor of dtype float64, got torch.bfloat16"),
    R("te_autodiff.torch.op call", "tensors",
      "torch_op()(torch.ones(3, 4, dtype=torch.float64).to_sparse(), torch.from_numpy(i))",
      TypeError, "input 'A' must be a dense tensor of dtype float64, got torch.float64 (torch.sparse_coo)"),
    R("te_autodiff.torch.op call", "tensors",
      "torch_op()(torch.nested.nested_tensor([torch.ones(4, dtype=torch.float64)] * 3), torch.from_numpy(i))",
      TypeError, "input 'A' must be a dense tensor"),
    R("te_autodiff.torch.op call", "tensors",
      "torch_op()(torch.ones(3, 4, dtype=torch.float64, device='meta'), torch.from_numpy(i))",
      ValueError, "input 'A' is on meta; te kernels run on the CPU"),
    # ------------------------------------------------------------ te_autodiff.jax.op
    R("te_autodiff.jax.op", "inputs", "tej.op(['P'], Q)",
      TypeError, "te_autodiff.jax.op: inputs must be te tensors, got 'P'"),
    R("te_autodiff.jax.op", "outputs", "tej.op([P], [])",
      ValueError, "te_autodiff.jax.op: no outputs given"),
    R("te_autodiff.jax.op", "name", "tej.op([P], Q, name=['q'])",
      TypeError, "te.build: name must be a str"),
    R("te_autodiff.jax.op call", "arrays", "jax_op()()",
      TypeError, "te op 'Q' takes 1 arrays (P), got 0"),
    R("te_autodiff.jax.op call", "arrays", "jax_op()([[1.0] * 4] * 3)",
      TypeError, "input 'P' must be a JAX or numpy array, got list"),
    R("te_autodiff.jax.op call", "arrays", "jax_op()(torch.ones(3, 4))",
      TypeError, "input 'P' must be a JAX or numpy array, got Tensor"),
    R("te_autodiff.jax.op call", "arrays", "jax_op()(jnp.ones((4, 3)))",
      ValueError, "input 'P' has shape (4, 3), expected (3, 4)"),
    R("te_autodiff.jax.op call", "arrays", "jax.jit(jax_op())(jnp.ones((4, 3)))",
      ValueError, "input 'P' has shape (4, 3), expected (3, 4)"),
    R("te_autodiff.jax.op call", "arrays", "jax_op()(jnp.ones((3, 4), jnp.bfloat16))",
      TypeError, "input 'P' has dtype bfloat16, expected float32"),
    R("te_autodiff.jax.op call", "arrays", "tej.op([A, I], C)(a, i)",
      TypeError, "te op 'C': 'A' is float64, which JAX supports only with jax_enable_x64", {"JAX_ENABLE_X64": "0"}),
    # ------------------------------------------------------------ environment
    R("TE_TARGET", "value", "kernel()",
      ValueError, "TE_TARGET: unknown target 'pentium9'", {"TE_TARGET": "pentium9"}),
    R("TE_TARGET", "value", "kernel()",
      ValueError, "TE_TARGET: unknown target ':'", {"TE_TARGET": ":"}),
    R("TE_NUM_THREADS", "value", "kernel()(a, i)",
      ValueError, "TE_NUM_THREADS must be a whole number of threads, got 'four'", {"TE_NUM_THREADS": "four"}),
    R("TE_NUM_THREADS", "value", "kernel()(a, i)",
      ValueError, "TE_NUM_THREADS must be a whole number of threads, got '1.5'", {"TE_NUM_THREADS": "1.5"}),
    R("TE_NUM_THREADS", "value", "kernel()(a, i)",
      ValueError, "TE_NUM_THREADS must be between 1 and 4096 threads, got 0", {"TE_NUM_THREADS": "0"}),
    R("TE_NUM_THREADS", "value", "kernel()(a, i)",
      ValueError, "TE_NUM_THREADS must be between 1 and 4096 threads, got -2", {"TE_NUM_THREADS": "-2"}),
    R("TE_NUM_THREADS", "value", "kernel()(a, i)",
      ValueError, "TE_NUM_THREADS must be between 1 and 4096 threads, got 100000", {"TE_NUM_THREADS": "100000"}),
    R("TE_LLVM_TIMEOUT", "value", "kernel()",
      ValueError, "TE_LLVM_TIMEOUT must be a positive number of seconds, got 'soon'", {"TE_LLVM_TIMEOUT": "soon"}),
    R("TE_LLVM_TIMEOUT", "value", "kernel()",
      ValueError, "TE_LLVM_TIMEOUT must be a positive number of seconds, got '-1'", {"TE_LLVM_TIMEOUT": "-1"}),
    # ------------------------------------------------------------ te.scan
    R("te.scan", "init", "te.scan(np.ones((1, 3)), Upd, St, name='Y')",
      TypeError, "te.scan 'Y': init must be te tensors, got ndarray"),
    R("te.scan", "init", "te.scan(te.compute((6, 3), lambda t, j: X[0, j], name='I6'), Upd, St, name='Y')",
      ValueError, "te.scan 'Y': init 'I6' has shape (6, 3)"),
    R("te.scan", "update", "te.scan(Ini, X, St, name='Y')",
      TypeError, "te.scan 'Y': update 'X' must be a te.compute"),
    R("te.scan", "update", "te.scan(Ini, te.compute((5, 3), lambda t, j: St[t, j] + 1.0, name='Now'), St, name='Y')",
      ValueError, "te.scan 'Y': 'Now' reads 'St' at time t"),
    R("te.scan", "state", "te.scan(Ini, Upd, Upd, name='Y')",
      TypeError, "te.scan 'Y': state 'Upd' must be a te.placeholder"),
    R("te.scan", "state", "te.scan(Ini, Upd, te.placeholder((5, 3), 'float32', 'St32'), name='Y')",
      TypeError, "te.scan 'Y': 'Ini' has dtype float64, state 'St32' has dtype float32"),
    R("te.scan", "state", "te.scan([Ini], Upd, St, name='Y')",
      TypeError, "te.scan 'Y': init, update and state must all be tensors or all lists"),
    R("te.scan", "state", "te.scan([Ini, Ini], [Upd], [St], name='Y')",
      ValueError, "te.scan 'Y': init, update and state must be lists of the same (non-zero) length, got 2, 1 and 1"),
    R("te.scan", "inputs", "te.scan(Ini, Upd, St, inputs=[3], name='Y')",
      TypeError, "te.scan 'Y': inputs must be te tensors, got int"),
    R("te.scan", "name", "te.scan(Ini, Upd, St, name=5)",
      TypeError, "te.scan: name must be a str"),
    R("te.scan", "name", "te.build([X], [te.scan(Ini, Upd, St, name='Y\\x00')])",
      ValueError, "te.scan: name 'Y\\x00' has a non-printable", CHILD),
]

ACCEPTED = [     # inputs that look wrong but are valid: (code, the value it equals)
    ("kernel()(np.frombuffer(a.tobytes()).reshape(3, 4), i)", "2 * a + i[:, None]"),               # read-only
    ("kernel()(np.frombuffer(b'.' + a.tobytes(), np.float64, offset=1).reshape(3, 4), i)",          # unaligned
     "2 * a + i[:, None]"),
    ("kernel()(np.broadcast_to(a[0], (3, 4)), i)", "2 * a[0] + i[:, None]"),                         # zero strides
    ("te.build([I], [te.compute((3,), lambda r: I[r] + (te.const(2**31 - 1, 'int32') + 1), name='W')])(i)",
     "i + np.int32(-2**31)"),                                           # a folded int overflow wraps, as in numpy
    ("tet.op([A, I], C, name='1 x-y')(torch.from_numpy(a), torch.from_numpy(i))", "2 * a + i[:, None]"),
    ("te.target(' haswell ').cpu", "'haswell'"),
]


@functools.cache
def kernel():
    """``te.build([A, I], [C])``, built on first use (in a child: under its environment)."""
    f = fixtures()
    return te.build([f["A"], f["I"]], [f["C"]])


@functools.cache
def torch_op():
    """``te_autodiff.torch.op([A, I], C)``."""
    pytest.importorskip("torch")
    f = fixtures()
    return importlib.import_module("te_autodiff.torch").op([f["A"], f["I"]], f["C"])


@functools.cache
def jax_op():
    """``te_autodiff.jax.op([P], Q)``: float32, so it runs without jax_enable_x64."""
    pytest.importorskip("jax")
    f = fixtures()
    return importlib.import_module("te_autodiff.jax").op([f["P"]], f["Q"])


@functools.cache
def fixtures() -> dict:
    """The names the table's code reads: a float64 program ``C = 2 A + I``
    over placeholders ``A`` (3, 4) and ``I`` (3,) int32 (``kernel()`` builds
    it), good arrays ``a`` and ``i``, a reduce axis ``k`` over 4, and smaller
    programs for the rows that need one (a gather ``G = T[J]``, a reduction
    ``Rd`` and its reader ``Rd2``, an elementwise ``Sq`` and its reader
    ``Sq2``, a float32 ``Q = 2 P``, a scan's ``Ini``, ``Upd`` and state ``St``)."""
    A = te.placeholder((3, 4), "float64", "A")
    I = te.placeholder((3,), "int32", "I")
    k = te.reduce_axis(4, "k")
    T, J = te.placeholder((5,), "float64", "T"), te.placeholder((3,), "int32", "J")
    P = te.placeholder((3, 4), "float32", "P")
    X, St = te.placeholder((5, 3), "float64", "X"), te.placeholder((5, 3), "float64", "St")
    Rd = te.compute((3,), lambda r: te.sum(A[r, k], axis=k), name="Rd")
    Sq = te.compute((3, 4), lambda r, c: A[r, c] * A[r, c], name="Sq")
    return dict(
        te=te, np=np, kernel=kernel, torch_op=torch_op, jax_op=jax_op,
        A=A, I=I, k=k, T=T, J=J, P=P, X=X, St=St, Rd=Rd, Sq=Sq,
        B=te.placeholder((4,), "float64", "B"), S=te.placeholder((), "float64", "S"),
        C=te.compute((3, 4), lambda r, c: A[r, c] * 2.0 + I[r].astype("float64"), name="C"),
        G=te.compute((3,), lambda n: T[J[n]], name="G"),
        Q=te.compute((3, 4), lambda r, c: P[r, c] * 2.0, name="Q"),
        Rd2=te.compute((3,), lambda r: Rd[r] * 2.0, name="Rd2"),
        Sq2=te.compute((3, 4), lambda r, c: Sq[r, c] + 1.0, name="Sq2"),
        Ini=te.compute((1, 3), lambda t, j: X[0, j], name="Ini"),
        Upd=te.compute((5, 3), lambda t, j: te.tanh(St[t - 1, j] * 0.5 + X[t, j]), name="Upd"),
        a=np.linspace(-1.0, 1.0, 12).reshape(3, 4), i=np.arange(3, dtype=np.int32),
    )


_MODULES = {"torch": ("torch",), "tet": ("torch", "te_autodiff.torch"),
            "jax": ("jax",), "jnp": ("jax", "jax.numpy"), "tej": ("jax", "te_autodiff.jax")}


def _eval(code: str):
    """The value of the expression ``code`` over :func:`fixtures` and the
    framework modules it names (skipped when one is not installed)."""
    scope = dict(fixtures())
    for alias, modules in _MODULES.items():
        if re.search(rf"\b{alias}\.", code):
            scope[alias] = [pytest.importorskip(m) for m in modules][-1]
    return eval(code, scope)


def outcome(code: str):
    """``(exception type, message)`` raised by :func:`_eval` of ``code``, or None."""
    try:
        _eval(code)
    except Exception as e:      # noqa: BLE001 - the row says which exception
        return f"{type(e).__module__}.{type(e).__qualname__}", str(e)
    return None


_CHILD_SCRIPT = """
import json, sys
sys.path.insert(0, {tests!r})
import pytest
import test_bad_input as m
try:
    print(json.dumps(m.outcome(m.TABLE[{n}].code)))
except pytest.skip.Exception as e:
    print(json.dumps(["skip", str(e)]))
"""


def _in_child(n: int, env: dict):
    """:func:`outcome` of row ``n`` in a new Python process with ``env`` added
    to the environment: a crash or a hang fails the row, not the test run."""
    script = _CHILD_SCRIPT.format(tests=os.path.dirname(os.path.abspath(__file__)), n=n)
    proc = subprocess.run([sys.executable, "-c", script], env={**os.environ, **env},
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"the child process failed ({proc.returncode}):\n{proc.stderr[-3000:]}"
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    if got is not None and got[0] == "skip":
        pytest.skip(got[1])
    return got if got is None else tuple(got)


@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors")     # the strided kind, on purpose
@pytest.mark.parametrize("n", range(len(TABLE)), ids=[f"{r.api}-{r.arg}-{n}" for n, r in enumerate(TABLE)])
def test_bad_input(n):
    """Row ``n`` of the table raises exactly its exception, with its fragment in the message."""
    row = TABLE[n]
    if row.api == "te.scan" and not hasattr(te, "scan"):
        pytest.skip("te.scan is not in this tree")
    got = outcome(row.code) if row.env is None else _in_child(n, row.env)
    assert got is not None, f"{row.code} raised nothing"
    assert got[0] == f"builtins.{row.exc.__name__}", f"{row.code} raised {got[0]}: {got[1]}"
    assert row.fragment in got[1], f"{row.code}: {row.fragment!r} is not in the message {got[1]!r}"


@pytest.mark.parametrize("code,equals", ACCEPTED)
def test_accepted_input(code, equals):
    """Inputs that look wrong but are valid give the right answer."""
    np.testing.assert_array_equal(_eval(code), _eval(equals))


def test_every_public_name_has_a_row():
    """The table covers each function of ``te.__all__`` (bar the types and
    constants) and each SPEC entry point outside it."""
    covered = {r.api for r in TABLE}
    public = {f"te.{name}" for name in te.__all__ if name not in ("DTYPES", "Expr", "Var", "Tensor")}
    extra = {"Kernel.__call__", "Kernel attributes", "Tensor.__getitem__", "te_autodiff.torch.op",
             "te_autodiff.jax.op", "TE_TARGET", "TE_NUM_THREADS"}
    assert public | extra <= covered, sorted(public | extra - covered)
