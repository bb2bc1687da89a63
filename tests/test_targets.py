"""Targets: ``te.target`` names every CPU, ``te.build(..., target=)`` compiles for it.

Checks the SPEC section "Targets: every CPU": the :class:`Target` fields for
named CPUs, ``"host"`` and ``TE_TARGET``; assembly for each instruction set;
cross-compiled kernels that are inspectable but refuse to run; results of
kernels built for narrower CPUs; masked tails no wider than the target's
vector; and a corpus of more than a hundred programs (``tests/corpus.py``)
compiled to machine code for six targets, each in a child process so that
an LLVM abort fails one test instead of killing pytest.

Whether this machine can run a target is asked of ``Target.missing_on_host``,
never assumed: the same tests hold on an AVX-512 or an AArch64 machine.
"""
from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

import te_autodiff as te
from corpus import masked_too_wide

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
ARM = "aarch64-unknown-linux-gnu:neoverse-n1"
SIX = ("x86-64-v2", "haswell", "znver3", "skylake-avx512", "icelake-server", ARM)
SIX_ARM_MARKED = [*SIX[:-1], pytest.param(ARM, marks=pytest.mark.aarch64)]    # ARM's case runs in .ci/aarch64 too


def host_arch() -> str:
    return te.target("host").triple.split("-")[0]


# ---------------------------------------------------------------- te.target


# name -> (arch, cpu, features it has, features it lacks, vector_bytes, vector_registers)
NAMED = {
    "x86-64-v2": ("x86_64", "x86-64-v2", {"sse2", "sse4.2", "popcnt"}, {"avx", "avx2", "fma", "avx512f"}, 16, 16),
    "haswell": ("x86_64", "haswell", {"avx", "avx2", "fma"}, {"avx512f"}, 32, 16),
    "znver3": ("x86_64", "znver3", {"avx2", "fma"}, {"avx512f"}, 32, 16),
    "skylake-avx512": ("x86_64", "skylake-avx512", {"avx2", "fma", "avx512f"}, set(), 64, 32),
    "icelake-server": ("x86_64", "icelake-server", {"avx2", "fma", "avx512f"}, set(), 64, 32),
    ARM: ("aarch64", "neoverse-n1", {"neon"}, {"avx", "avx2", "sse2"}, 16, 32),
    "neoverse-n1": ("aarch64", "neoverse-n1", {"neon"}, {"avx", "avx2", "sse2"}, 16, 32),
}


@pytest.mark.parametrize("name", list(NAMED))
def test_named_target_fields(name):
    """Every field the SPEC names, for x86 levels, AVX2, AVX-512 and NEON CPUs."""
    arch, cpu, has, lacks, vector_bytes, registers = NAMED[name]
    t = te.target(name)
    assert t.name == name
    assert t.triple.split("-")[0] == arch
    assert t.cpu == cpu
    assert has <= set(t.features), f"{name} lacks {has - set(t.features)}"
    assert not lacks & set(t.features), f"{name} claims {lacks & set(t.features)}"
    assert t.vector_bytes == vector_bytes
    assert t.vector_registers == registers
    assert te.target(name) == t                                  # the same description every time


def test_triple_prefix_is_the_same_cpu():
    """``triple:cpu`` and the bare CPU name describe the same CPU."""
    full, bare = te.target(ARM), te.target("neoverse-n1")
    assert (full.triple, full.cpu, full.features, full.vector_bytes) == \
        (bare.triple, bare.cpu, bare.features, bare.vector_bytes)
    assert full.triple == "aarch64-unknown-linux-gnu"


@pytest.mark.parametrize("name", ["haswell", "skylake-avx512", ARM])
def test_target_prints_readably(name):
    """``str(target)`` is one readable line naming the CPU and its vectors, not a dataclass dump."""
    t = te.target(name)
    text = str(t)
    assert "\n" not in text and "frozenset" not in text and "Target(" not in text
    for part in (t.name, t.cpu, t.triple, str(t.vector_bytes)):
        assert part in text, f"{part!r} missing from {text!r}"


@pytest.mark.aarch64
def test_host_target(monkeypatch):
    """``"host"`` is this machine: runnable, a known vector width, the same as ``te.target()`` without TE_TARGET."""
    monkeypatch.delenv("TE_TARGET", raising=False)
    t = te.target("host")
    assert t.name == "host" and t.cpu and t.triple
    assert t.missing_on_host() is None
    assert t.vector_bytes in (16, 32, 64) and t.vector_registers in (16, 32)
    assert te.target() == t and te.target(None) == t
    if t.triple.startswith("x86_64"):
        assert "sse2" in t.features
        assert t.vector_bytes == (64 if "avx512f" in t.features else 32 if "avx" in t.features else 16)


def test_host_caches_come_from_the_index_directories(tmp_path, monkeypatch):
    """The L1 data size and ways and the L2 size are read from ``index<N>``
    directories alone: an other entry (``uevent``, which Linux may list first)
    is not a cache and does not turn the reading into the defaults."""
    from lowering import target as target_module

    (tmp_path / "uevent").write_text("")
    for n, (level, kind, size, ways) in enumerate([(1, "Data", "48K", 12), (1, "Instruction", "32K", 8),
                                                   (2, "Unified", "2048K", 16), (3, "Unified", "32M", 16)]):
        d = tmp_path / f"index{n}"
        d.mkdir()
        for name, text in (("level", level), ("type", kind), ("size", size), ("ways_of_associativity", ways),
                           ("shared_cpu_list", "0-5,12-13")):
            (d / name).write_text(f"{text}\n")
    monkeypatch.setattr(os, "listdir", lambda root: ["uevent", "index2", "index0", "index3", "index1"])
    assert target_module._sys_caches(str(tmp_path)) == (48 * 1024, 2048 * 1024, 4 * 1024 * 1024, 12)
    monkeypatch.undo()
    assert target_module._sys_caches(str(tmp_path / "absent")) == (*target_module.DEFAULT_CACHES, None)


@pytest.mark.parametrize("cpu_list, count", [("0", 1), ("0-1", 2), ("0-3,8-11", 8), ("2,4,6", 3), ("", 1)])
def test_a_cpu_list_counts_its_cpus(cpu_list, count):
    from lowering import target as target_module
    assert target_module._cpu_count(cpu_list) == count


@pytest.mark.parametrize("cpu, per_core_sys, want", [
    ("znver4", 16 << 20, 4 << 20),        # a VM of 2 CPUs on a 32 MiB L3: the table's 4 MiB a core
    ("znver4", 2 << 20, 2 << 20),         # /sys below the table: /sys
    ("not-a-known-cpu", 16 << 20, 16 << 20)])
def test_the_hosts_l3_share_is_at_most_its_cpus(monkeypatch, cpu, per_core_sys, want):
    """``/sys`` in a VM lists only the VM's CPUs as sharing the L3, so the
    host's share of it is capped by its CPU's figure in the table."""
    from lowering import target as target_module
    monkeypatch.setattr(target_module, "_sys_caches", lambda: (32 * 1024, 1 << 20, per_core_sys, 8))
    monkeypatch.setattr(target_module.llvm, "get_host_cpu_name", lambda: cpu)
    assert target_module.host_target.__wrapped__().l3_bytes == want


def test_named_cpus_give_a_cores_l3_share():
    assert te.target("haswell").l3_bytes == 2 << 20 and te.target("znver4").l3_bytes == 4 << 20
    assert te.target("cortex-a72").l3_bytes == 0
    assert "L3 2048 KiB a core" in str(te.target("haswell"))


# what LLVM 22.1 detects in a process QEMU 7.2 runs as an AArch64 CPU: it reads the
# x86 host's /proc/cpuinfo, finds no Features line and reports only these, off
QEMU_AARCH64_DETECTION = {"sha2": False, "aes": False, "sve": False, "rand": False}


@pytest.mark.parametrize("detected, arch_features", [
    (QEMU_AARCH64_DETECTION, None),
    ({**QEMU_AARCH64_DETECTION, "neon": True, "fp-armv8": True, "crc": True}, None),
    ({"neon": False}, {"fp-armv8"}),
])
@pytest.mark.aarch64
def test_an_aarch64_host_has_the_architectures_baseline(monkeypatch, detected, arch_features):
    """An AArch64 host whose detected features say nothing of FP and NEON (QEMU
    user-mode emulation, a chroot without /proc) still has them, as AArch64 Linux
    requires: kernels built for a named AArch64 CPU run there.  A feature LLVM
    reports off stays off."""
    from lowering import target as target_module

    class FeatureMap(dict):
        def flatten(self):
            return ",".join(("+" if on else "-") + k for k, on in self.items())

    monkeypatch.setattr(target_module.llvm, "get_process_triple", lambda: "aarch64-unknown-linux-gnu")
    monkeypatch.setattr(target_module.llvm, "get_host_cpu_name", lambda: "generic")
    monkeypatch.setattr(target_module.llvm, "get_host_cpu_features", lambda: FeatureMap(detected))
    target_module.host_target.cache_clear()
    try:
        host = target_module.host_target()
        on = {k for k, v in detected.items() if v}
        assert on <= host.features
        assert not {k for k, v in detected.items() if not v} & host.features
        assert host.arch == "aarch64" and (host.vector_bytes, host.vector_registers) == (16, 32)
        assert host.features - on == (arch_features if arch_features is not None else {"fp-armv8", "neon"} - on)
        why = te.target(ARM).missing_on_host()
        if arch_features is None:
            assert why is None, why
            assert "x86_64" in te.target("haswell").missing_on_host()
        else:
            assert why is not None and "neon" in why
        assert host.llvm_features == FeatureMap(detected).flatten()     # LLVM is told what it detected
    finally:
        monkeypatch.undo()
        target_module.host_target.cache_clear()


@pytest.mark.parametrize("name, ways", [("haswell", 8), ("icelake-server", 12), ("znver4", 8),
                                        ("aarch64-unknown-linux-gnu:neoverse-n1", 4), ("apple-m1", 8)])
def test_named_targets_know_their_l1_ways(name, ways):
    """A named CPU's L1 associativity follows from its L1 size (4 KiB ways on
    x86, 16 KiB on the ARM cores named), and the target prints it."""
    t = te.target(name)
    assert t.l1_ways == ways
    assert f"{ways}-way" in str(t)


def test_none_honours_te_target(monkeypatch):
    """``te.target()`` / ``te.target(None)`` read TE_TARGET; empty or unset means the host."""
    monkeypatch.setenv("TE_TARGET", "haswell")
    assert te.target().cpu == "haswell" and te.target(None).name == "haswell"
    monkeypatch.setenv("TE_TARGET", ARM)
    assert te.target().triple.startswith("aarch64") and te.target().vector_registers == 32
    assert te.target("host").name == "host"                     # an explicit name wins over TE_TARGET
    monkeypatch.setenv("TE_TARGET", "")
    assert te.target().name == "host"
    monkeypatch.delenv("TE_TARGET")
    assert te.target().name == "host"


def test_te_build_honours_te_target(monkeypatch):
    """``te.build`` without ``target`` compiles for TE_TARGET; an explicit target wins."""
    x, y = _elementwise("float32", 13)
    monkeypatch.setenv("TE_TARGET", "x86-64-v2")
    k = te.build(x, y)
    assert k.target.name == "x86-64-v2" and "ymm" not in k.asm
    monkeypatch.setenv("TE_TARGET", ARM)
    k = te.build(x, y)
    assert k.target.triple.startswith("aarch64")
    assert 'target triple = "aarch64' in k.llvm_ir
    assert te.build(x, y, target="haswell").target.name == "haswell"


@pytest.mark.parametrize("name", ["pentium-9000", "haswel", "aarch64-unknown-linux-gnu:haswell",
                                  "x86_64-unknown-linux-gnu:neoverse-n1"])
def test_unknown_target_is_a_value_error_naming_it(name, monkeypatch):
    """An unknown CPU, or a CPU under the wrong architecture's triple, raises ValueError with the name."""
    monkeypatch.delenv("TE_TARGET", raising=False)
    with pytest.raises(ValueError) as info:
        te.target(name)
    assert name in str(info.value)
    x, y = _elementwise("float64", 5)
    with pytest.raises(ValueError):
        te.build(x, y, target=name)


def test_unknown_te_target_is_a_value_error(monkeypatch):
    """A bad TE_TARGET fails like a bad argument: ValueError naming it."""
    monkeypatch.setenv("TE_TARGET", "not-a-cpu")
    with pytest.raises(ValueError, match="not-a-cpu"):
        te.target()


@pytest.mark.parametrize("value", [42, 3.5, ["haswell"], b"haswell", ("x86-64-v2",)])
def test_wrong_type_is_a_type_error(value):
    """A target that is neither a name nor a Target raises TypeError."""
    with pytest.raises(TypeError):
        te.target(value)


@pytest.mark.aarch64
def test_missing_on_host_explains_why():
    """``missing_on_host`` is None for this machine and for the x86-64-v2 baseline on x86,
    and names the architecture or the lacking features otherwise."""
    host = te.target("host")
    arm = te.target(ARM).missing_on_host()
    if host_arch() == "x86_64":
        assert te.target("x86-64-v2").missing_on_host() is None
        assert arm is not None and "aarch64" in arm
        avx512 = te.target("skylake-avx512").missing_on_host()
        lacking = te.target("skylake-avx512").features - host.features
        assert (avx512 is None) == (not lacking)
        assert all(f in avx512 for f in lacking), avx512
    else:
        assert te.target("x86-64-v2").missing_on_host() is not None
        assert "x86_64" in te.target("haswell").missing_on_host()


# ---------------------------------------------------------------- te.build(..., target=)


def _matmul(dtype, n=37, d=29, m=41):
    A, B = te.placeholder((n, d), dtype, "A"), te.placeholder((d, m), dtype, "B")
    k = te.reduce_axis(d, "k")
    return [A, B], [te.compute((n, m), lambda i, j: te.sum(A[i, k] * B[k, j], axis=k), name="C")]


def _elementwise(dtype, n, rows=5):
    X = te.placeholder((rows, n), dtype, "X")
    return [X], [te.compute((rows, n), lambda i, j: te.exp(X[i, j]) * 2.0 + X[i, j], name="E")]


def _row_softmax(dtype, rows=6, cols=37):
    X = te.placeholder((rows, cols), dtype, "X")
    k1, k2 = te.reduce_axis(cols, "k"), te.reduce_axis(cols, "k")
    m = te.compute((rows,), lambda i: te.max(X[i, k1], axis=k1), name="m")
    e = te.compute((rows, cols), lambda i, j: te.exp(X[i, j] - m[i]), name="e")
    s = te.compute((rows,), lambda i: te.sum(e[i, k2], axis=k2), name="s")
    return [X], [te.compute((rows, cols), lambda i, j: e[i, j] / s[i], name="softmax")]


def _dense_grad(dtype, n=9, d=21, m=13):
    X, W, b = te.placeholder((n, d), dtype, "X"), te.placeholder((m, d), dtype, "W"), te.placeholder((m,), dtype, "b")
    k = te.reduce_axis(d, "k")
    Y = te.compute((n, m), lambda i, j: te.maximum(te.sum(X[i, k] * W[j, k], axis=k) + b[j], 0.0), name="Y")
    H = te.placeholder((n, m), dtype, "H")
    return [X, W, b, H], [Y, *te.gradient(Y, [X, W, b], head=H)]


# assembly markers of each instruction set on a float32 matmul (x86 in AT&T syntax)
ASM_MARKERS = {
    "x86-64-v2": ([r"%xmm\d", r"\bmulps\b|\bmulss\b"], [r"ymm", r"zmm", r"vfmadd"]),
    "haswell": ([r"%ymm\d", r"vfmadd\w*ps"], [r"zmm"]),
    "znver3": ([r"%ymm\d", r"vfmadd\w*ps"], [r"zmm"]),
    "skylake-avx512": ([r"%zmm\d", r"vfmadd\w*ps"], []),
    "icelake-server": ([r"%zmm\d", r"vfmadd\w*ps"], []),
    ARM: ([r"\bfmla\b", r"\bv\d+\.4s\b"], [r"%r[a-z]", r"xmm", r"ymm"]),
}


@pytest.mark.parametrize("name", SIX_ARM_MARKED)
def test_asm_is_for_the_target(name):
    """``kernel.asm`` of a float32 matmul uses the target's registers and FMA instructions only."""
    kernel = te.build(*_matmul("float32"), target=name)
    assert kernel.target == te.target(name)
    asm = kernel.asm
    present, absent = ASM_MARKERS[name]
    for pattern in present:
        assert re.search(pattern, asm), f"{pattern!r} not in the {name} assembly"
    for pattern in absent:
        assert not re.search(pattern, asm), f"{pattern!r} in the {name} assembly"
    assert f'target triple = "{te.target(name).triple}"' in kernel.llvm_ir
    assert kernel.asm == asm                                       # stable on a second look


def _numpy_inputs(inputs, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(t.shape).astype(t.dtype) for t in inputs]


@pytest.mark.parametrize("name", SIX)
@pytest.mark.aarch64
def test_kernel_runs_or_refuses_with_a_reason(name):
    """A kernel for a CPU this machine cannot run is built and inspectable, and calling it
    raises RuntimeError naming the target and what the host lacks; otherwise it runs."""
    inputs, outputs = _matmul("float32")
    kernel = te.build(inputs, outputs, target=name)
    assert kernel.target.name == name
    for text in (kernel.loop_ir, kernel.llvm_ir, kernel.asm):
        assert isinstance(text, str) and len(text) > 100
    assert "stage0" in kernel.asm
    a, b = _numpy_inputs(inputs)
    why = te.target(name).missing_on_host()
    if why is None:
        np.testing.assert_allclose(kernel(a, b), a.astype(np.float64) @ b, rtol=1e-4, atol=1e-4)
        return
    with pytest.raises(RuntimeError) as info:
        kernel(a, b)
    message = str(info.value)
    assert name in message and why in message
    if te.target(name).arch != host_arch():
        assert te.target(name).arch in message
    else:
        lacking = sorted(te.target(name).features - te.target("host").features)
        assert lacking and any(f in message for f in lacking)


@pytest.mark.aarch64
def test_cross_compiled_kernel_still_checks_arguments():
    """Wrong arguments to a cross-compiled kernel are reported like any kernel's (TypeError/ValueError)."""
    inputs, outputs = _matmul("float64")
    kernel = te.build(inputs, outputs, target=ARM)
    a, b = _numpy_inputs(inputs)
    with pytest.raises(TypeError):
        kernel(a)
    with pytest.raises(ValueError):
        kernel(a, b[:3])
    if te.target(ARM).missing_on_host() is not None:
        with pytest.raises(RuntimeError):
            kernel(a, b)


def _np_softmax(x):
    e = np.exp(x - x.max(1, keepdims=True))
    return e / e.sum(1, keepdims=True)


def _np_dense_grad(x, w, b, h):
    y = x @ w.T + b
    g = h * (y > 0)
    return [np.maximum(y, 0), g @ w, g.T @ x, g.sum(0)]


PROGRAMS = {
    "matmul_f32": (lambda: _matmul("float32"), lambda a, b: [a @ b]),
    "matmul_f64": (lambda: _matmul("float64", 19, 33, 7), lambda a, b: [a @ b]),
    "elementwise_tail_f32": (lambda: _elementwise("float32", 67), lambda x: [np.exp(x) * 2 + x]),
    "softmax_f64": (lambda: _row_softmax("float64"), lambda x: [_np_softmax(x)]),
    "dense_relu_grad_f32": (lambda: _dense_grad("float32"), _np_dense_grad),
}


@pytest.mark.parametrize("program", list(PROGRAMS))
@pytest.mark.parametrize("name", ["x86-64-v2", "haswell"])
def test_narrower_target_matches_numpy(name, program):
    """Kernels built for an older x86 CPU than this one give numpy's results."""
    make, reference = PROGRAMS[program]
    inputs, outputs = make()
    kernel = te.build(inputs, outputs, target=name)
    arrays = _numpy_inputs(inputs, seed=len(program))
    if te.target(name).missing_on_host() is not None:     # e.g. an AArch64 machine
        with pytest.raises(RuntimeError, match=name):
            kernel(*arrays)
        return
    got = kernel(*arrays)
    got = list(got) if isinstance(got, tuple) else [got]
    want = reference(*[a.astype(np.float64) for a in arrays])
    assert len(got) == len(want)
    tol = 1e-4 if inputs[0].dtype == "float32" else 1e-10
    for n, (g, w) in enumerate(zip(got, want)):
        assert g.dtype == np.dtype(outputs[n].dtype)
        np.testing.assert_allclose(g, w, rtol=tol, atol=tol * max(1.0, float(np.abs(w).max())),
                                   err_msg=f"{program} on {name}, output {n}")


# ---------------------------------------------------------------- masked tails


MASKED = re.compile(r'@"?llvm\.masked\.(load|store)\.v(\d+)(f32|f64)')


@pytest.mark.parametrize("name", SIX_ARM_MARKED)
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_masked_tails_are_no_wider_than_the_target(name, dtype):
    """Vector loops whose extent is not a multiple of the lanes end in masked loads and
    stores of at most the target's native width (wider ones abort LLVM 22.1's code generator)."""
    t = te.target(name)
    itemsize = np.dtype(dtype).itemsize
    elem = dtype[0] + dtype[-2:]                                 # f32 / f64, as LLVM names it
    found = set()
    for inputs, outputs in (_elementwise(dtype, 13), _elementwise(dtype, 67, rows=3), _matmul(dtype),
                            _row_softmax(dtype), _dense_grad(dtype)):
        kernel = te.build(inputs, outputs, target=name)
        ir = kernel.llvm_ir
        assert masked_too_wide(ir, t.vector_bytes) == [], f"{name} {dtype}: {masked_too_wide(ir, t.vector_bytes)}"
        found |= {int(m.group(2)) for m in MASKED.finditer(ir) if m.group(3) == elem}
        if name == "haswell":                                    # 64 bytes: twice AVX2's vectors
            assert f"llvm.masked.load.v{64 // itemsize}{elem}" not in ir
        kernel.asm                                               # and the code generator accepts them
    assert found, f"no masked {dtype} tail on {name}: the check above would be vacuous"
    assert max(found) * itemsize <= t.vector_bytes


def _max_pool_f64(shape=(1, 1, 4, 6)):
    X = te.placeholder(shape, "float64", "X")
    kh, kw = te.reduce_axis(2, "kh"), te.reduce_axis(2, "kw")
    out = (shape[0], shape[1], shape[2] // 2, shape[3] // 2)
    return [X], [te.compute(out, lambda n, c, y, x: te.max(X[n, c, y * 2 + kh, x * 2 + kw], axis=[kh, kw]),
                            name="pool")]


@pytest.mark.parametrize("name", SIX_ARM_MARKED)
def test_te_emits_no_masked_operation_wider_than_the_target(name):
    """The LLVM IR te emits (before LLVM's optimiser) for a strided max pool and a masked tail
    has masked operations of at most the target's width, and compiles."""
    from corpus import emitted_ir

    for inputs, outputs in (_max_pool_f64(), _elementwise("float64", 13)):
        kernel = te.build(inputs, outputs, target=name)
        assert masked_too_wide(emitted_ir(kernel), te.target(name).vector_bytes) == []
        assert "stage0" in kernel.asm


@pytest.mark.parametrize("name", ["haswell", "skylake-avx512"])
def test_optimised_max_pool_has_no_masked_load_wider_than_the_target(name):
    """The same bound on the optimised IR (``kernel.llvm_ir``): LLVM's SLP
    vectoriser would make ``llvm.masked.load.v8f64`` of this pool's strided
    loads on haswell; the runtime then optimises without it."""
    kernel = te.build(*_max_pool_f64(), target=name)
    assert masked_too_wide(kernel.llvm_ir, te.target(name).vector_bytes) == []


# ---------------------------------------------------------------- the corpus, one child per target


CHILD_TIMEOUT = 420          # seconds for one target's child (about 60 s on a quiet 2-core machine)
CHILDREN = 2                 # children compiling at the same time
SAMPLE_TIMEOUT = 1800        # seconds for the run sample (about 5 min under QEMU's emulation of AArch64)


def _run_child(target, programs=(), env=None, timeout=CHILD_TIMEOUT):
    """Run ``tests/corpus.py target [programs]``; returns (returncode or None on timeout, stdout, stderr, seconds)."""
    env = {**os.environ, **(env or {})}
    env["PYTHONPATH"] = os.pathsep.join([ROOT, HERE] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env.pop("TE_TARGET", None)
    t0 = time.perf_counter()
    try:
        p = subprocess.run([sys.executable, os.path.join(HERE, "corpus.py"), target, *programs], cwd=ROOT, env=env,
                           capture_output=True, text=True, timeout=timeout)
        return p.returncode, p.stdout, p.stderr, time.perf_counter() - t0
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        err = e.stderr.decode() if isinstance(e.stderr, bytes) else (e.stderr or "")
        return None, out, err, time.perf_counter() - t0


@pytest.fixture(scope="module", autouse=True)
def corpus_runs(request):
    """One child per selected corpus test's target, ``CHILDREN`` at a time, started with the
    module's first test (they compile while the quick tests run)."""
    wanted = [item.callspec.params["target"] for item in request.session.items
              if getattr(item, "originalname", None) == "test_corpus_compiles_for_target"
              and item.module is request.module]
    pool = ThreadPoolExecutor(max_workers=CHILDREN)
    runs = {t: pool.submit(_run_child, t) for t in wanted}
    yield runs
    pool.shutdown(wait=True)


def _last_program(stdout):
    """The program the child was compiling when it stopped (a BEGIN without its END)."""
    begun = re.findall(r"^BEGIN (.+)$", stdout, re.M)
    ended = set(re.findall(r"^END (.+)$", stdout, re.M))
    return begun[-1] if begun and begun[-1] not in ended else None


def _child_report(target, code, out, err, seconds):
    """The child's report, or a failure message naming the target, the program it was
    compiling, its return code and the tail of its stderr."""
    tail = "\n".join(err.strip().splitlines()[-25:])
    if code is None:
        return f"corpus for {target}: child timed out after {seconds:.0f} s while compiling " \
               f"{_last_program(out)!r}\nstderr tail:\n{tail}"
    if code != 0:
        return f"corpus for {target}: child exited with return code {code} while compiling " \
               f"{_last_program(out)!r}\nstderr tail:\n{tail}"
    results = [line for line in out.splitlines() if line.startswith("RESULT ")]
    if not results:
        return f"corpus for {target}: no RESULT from the child\nstderr tail:\n{tail}"
    return json.loads(results[-1][len("RESULT "):])


def test_a_child_that_aborts_is_reported():
    """The harness itself: a child killed by SIGABRT (as LLVM aborts) fails with the target,
    the program, the return code and stderr."""
    program = "nn/flatten_dense_f64"
    code, out, err, seconds = _run_child("haswell", [program], env={"TE_CORPUS_ABORT": program})
    message = _child_report("haswell", code, out, err, seconds)
    assert isinstance(message, str), "an aborted child produced a report"
    assert code != 0
    for part in ("haswell", repr(program), f"return code {code}", "LLVM ERROR: simulated abort"):
        assert part in message, f"{part!r} missing from {message!r}"


@pytest.mark.corpus
@pytest.mark.parametrize("target", SIX)
def test_corpus_compiles_for_target(target, corpus_runs):
    """Every corpus program compiles to machine code for ``target`` (in a child: an LLVM abort is a
    failure naming the program), with assembly for the target's ISA and no masked vector wider than
    its vectors; on a target this machine runs, a sample agrees with the same programs built for host."""
    code, out, err, seconds = corpus_runs[target].result()
    report = _child_report(target, code, out, err, seconds)
    if isinstance(report, str):
        pytest.fail(report)
    assert report["target"] == target
    assert report["programs"] >= 100, f"the corpus has only {report['programs']} programs"
    assert len(report["seconds"]) == report["programs"], "the child skipped programs"
    families = {n.split("/")[0] for n in report["names"]}
    assert {"bench", "nn", "op", "zero_elim"} <= families
    runnable = te.target(target).missing_on_host() is None
    assert report["runnable"] == runnable
    if runnable:
        assert report["ran"] >= report["programs"] // 10, "too few programs were run"
    assert report["with_masked"] >= 20, "too few programs with masked vector operations to check their width"
    failures = "\n".join(f"  {f['program']}: " + "\n    ".join(p.strip() for p in f["problems"])
                         for f in report["failures"])
    slowest = sorted(report["seconds"].items(), key=lambda kv: -kv[1])[:3]
    assert not report["failures"], (f"corpus for {target}: {len(report['failures'])} of {report['programs']} "
                                    f"programs failed ({seconds:.0f} s; slowest {slowest}):\n{failures}")


@pytest.mark.corpus
@pytest.mark.aarch64
def test_corpus_sample_runs_for_the_default_target():
    """The corpus programs that are run (every fifth), built for ``te.target()``
    (``TE_TARGET`` or this machine) and for ``"host"``, run here and agree, with
    the same compile checks as above.  On an AArch64 machine with ``TE_TARGET``
    naming its CPU (``.ci/aarch64``) this runs NEON kernels of every family,
    where the six-target corpus above only compiles them."""
    from corpus import run_sample

    target = te.target()
    if target.host:
        pytest.skip("te.target() is this machine: its kernels would be compared with themselves")
    if target.missing_on_host() is not None:
        pytest.skip(f"this machine cannot run {target.name}: {target.missing_on_host()}")
    code, out, err, seconds = _run_child(target.name, ["--sample"], timeout=SAMPLE_TIMEOUT)
    report = _child_report(target.name, code, out, err, seconds)
    if isinstance(report, str):
        pytest.fail(report)
    sample = run_sample()
    assert report["runnable"] and set(report["seconds"]) == sample
    assert {n.split("/")[0] for n in sample} >= {"bench", "nn", "op", "zero_elim"}
    assert report["ran"] == len(sample), f"{len(sample) - report['ran']} sampled programs were not run"
    failures = "\n".join(f"  {f['program']}: " + "\n    ".join(p.strip() for p in f["problems"])
                         for f in report["failures"])
    assert not report["failures"], (f"{target.name}: {len(report['failures'])} of {len(sample)} sampled "
                                    f"programs failed ({seconds:.0f} s):\n{failures}")


def test_one_thread_count_for_the_schedule_the_runtime_and_the_compilers():
    """TE_NUM_THREADS is the count the schedule balances for (Target.threads),
    the runtime splits across and the LLVM processes are limited by, whatever
    the cores (read in a child process, where the variable is set at start)."""
    code = (
        "import os, sys, te_autodiff as te\n"
        "from lowering import llvm_process, runtime\n"
        "n = int(sys.argv[1])\n"
        "workers = min(len(os.sched_getaffinity(0)), n, llvm_process.MAX_WORKERS)\n"
        "print(te.target().threads, te.target('haswell').threads, runtime.num_threads(),\n"
        "      llvm_process._worker_count() == workers)\n")
    for n in ("1", "7"):
        out = subprocess.run([sys.executable, "-c", code, n], env=dict(os.environ, TE_NUM_THREADS=n),
                             capture_output=True, text=True, timeout=120)
        assert out.stdout.split() == [n, n, n, "True"], out


@pytest.fixture
def fresh_throughput(tmp_path, monkeypatch):
    """The throughput cache in a scratch directory, nothing kept in the process."""
    from lowering import throughput

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(throughput, "_kept", {})
    return throughput, tmp_path / "te-autodiff" / throughput.CACHE_FILE


def test_throughput_is_measured_once_and_kept_in_the_cache_file(fresh_throughput, monkeypatch):
    """The first ask measures (finite, positive figures) and writes the
    file; a new process (nothing kept) reads it instead of measuring."""
    throughput, path = fresh_throughput
    work, l2 = throughput.measured(te.target())
    assert 0 < work < float("inf") and 0 < l2 < float("inf")
    assert list(json.loads(path.read_text()).values()) == [[work, l2]]

    def no_measuring(target):
        raise AssertionError("measured again")
    monkeypatch.setattr(throughput, "_kept", {})
    monkeypatch.setattr(throughput, "_work_per_ns", no_measuring)
    assert throughput.measured(te.target()) == (work, l2)


@pytest.mark.parametrize("content", ["{not json", "[1, 2]", '{"%s": [0, 5]}', '{"%s": ["a", 1]}'])
def test_a_damaged_throughput_file_is_measured_again(fresh_throughput, content):
    throughput, path = fresh_throughput
    path.parent.mkdir(parents=True)
    path.write_text(content.replace("%s", throughput._key(te.target())[1]))
    work, l2 = throughput.measured(te.target())
    assert work > 0 and l2 > 0
    assert [work, l2] in json.loads(path.read_text()).values()


def test_an_unwritable_cache_keeps_the_figures_in_the_process(fresh_throughput, monkeypatch):
    throughput, path = fresh_throughput
    path.parent.parent.mkdir(parents=True, exist_ok=True)
    path.parent.write_text("a file where the directory should be")
    figures = throughput.measured(te.target())
    assert all(x > 0 for x in figures)
    assert throughput.measured(te.target()) is figures


def test_targets_read_their_throughput_from_the_measurement(fresh_throughput):
    """``Target.work_per_ns`` / ``l2_bytes_per_ns`` are the measured figures;
    a target this machine cannot run has the host's (its estimate serves no
    kernel here), one it can run is measured at its own vector width."""
    throughput, _ = fresh_throughput
    host = dataclasses.replace(te.target("host"))        # nothing read yet
    assert (host.work_per_ns, host.l2_bytes_per_ns) == throughput.measured(host)
    foreign = te.target("x86-64-v2" if host_arch() == "aarch64" else ARM)
    assert foreign.missing_on_host() is not None
    assert throughput.measured(foreign) == throughput.measured(host)
