"""The CPU a kernel is compiled for: one frozen :class:`Target`, read by every later stage.

A target is built once, from this machine (``"host"``) or from a name (an
LLVM CPU, optionally preceded by a triple and a colon:
``"haswell"``, ``"aarch64-unknown-linux-gnu:neoverse-n1"``), and handed down
the pipeline.  It says what the code generator may assume: the widest native
vector, the architectural vector registers, FMA, whether streaming stores
are native, cache sizes, the thread default and one core's throughput.
Register tiles, lane counts, K blocks and the panel and streaming thresholds
are derived from these figures (``schedule/blocking.py``, ``codegen_llvm/``);
nothing else in the package asks LLVM about the host.

The features of a named CPU come from :data:`CPUS` (LLVM does not report the
features a CPU name implies); the host's come from LLVM's own detection and
its caches from ``/sys``.  A CPU this table does not know raises
``ValueError``: adding one is one line.
"""
from __future__ import annotations

import ctypes.util
import os
import threading
from dataclasses import dataclass, field
from functools import cached_property, lru_cache

import llvmlite.binding as llvm

KIB, MIB = 1 << 10, 1 << 20

# x86-64 micro-architecture levels (the psABI's), each adding to the one before
_X86_V1 = ("64bit", "cmov", "cx8", "fxsr", "mmx", "sse", "sse2")
_X86_V2 = _X86_V1 + ("cx16", "popcnt", "sahf", "sse3", "sse4.1", "sse4.2", "ssse3")
_X86_AVX = _X86_V2 + ("avx",)
_X86_V3 = _X86_AVX + ("avx2", "bmi", "bmi2", "f16c", "fma", "lzcnt", "movbe")
_X86_V4 = _X86_V3 + ("avx512bw", "avx512cd", "avx512dq", "avx512f", "avx512vl")
_ARM_V8 = ("fp-armv8", "neon")

# name -> (triple, features, L1 data bytes, L2 bytes per core, L3 bytes per core): the CPUs
# te-autodiff knows by name.  The last figure is a core's share of the cache beyond L2 (the
# chip's L3 over the cores that share it, as the vendor specifies; 0 without one)
X86, ARM = "x86_64-unknown-linux-gnu", "aarch64-unknown-linux-gnu"
CPUS = {
    "x86-64": (X86, _X86_V1, 32 * KIB, 256 * KIB, 2 * MIB),
    "x86-64-v2": (X86, _X86_V2, 32 * KIB, 256 * KIB, 2 * MIB),
    "x86-64-v3": (X86, _X86_V3, 32 * KIB, 512 * KIB, 2 * MIB),
    "x86-64-v4": (X86, _X86_V4, 32 * KIB, 1 * MIB, 1408 * KIB),
    "nehalem": (X86, _X86_V2, 32 * KIB, 256 * KIB, 2 * MIB),
    "westmere": (X86, _X86_V2, 32 * KIB, 256 * KIB, 2 * MIB),
    "sandybridge": (X86, _X86_AVX, 32 * KIB, 256 * KIB, 2 * MIB),
    "ivybridge": (X86, _X86_AVX + ("f16c",), 32 * KIB, 256 * KIB, 2 * MIB),
    "haswell": (X86, _X86_V3, 32 * KIB, 256 * KIB, 2 * MIB),
    "broadwell": (X86, _X86_V3, 32 * KIB, 256 * KIB, 2 * MIB),
    "skylake": (X86, _X86_V3, 32 * KIB, 256 * KIB, 2 * MIB),
    "alderlake": (X86, _X86_V3, 48 * KIB, 1280 * KIB, 3 * MIB),
    "znver1": (X86, _X86_V3, 32 * KIB, 512 * KIB, 2 * MIB),
    "znver2": (X86, _X86_V3, 32 * KIB, 512 * KIB, 4 * MIB),
    "znver3": (X86, _X86_V3, 32 * KIB, 512 * KIB, 4 * MIB),
    "skylake-avx512": (X86, _X86_V4, 32 * KIB, 1 * MIB, 1408 * KIB),
    "cascadelake": (X86, _X86_V4, 32 * KIB, 1 * MIB, 1408 * KIB),
    "cooperlake": (X86, _X86_V4, 32 * KIB, 1 * MIB, 1408 * KIB),
    "icelake-client": (X86, _X86_V4, 48 * KIB, 512 * KIB, 2 * MIB),
    "icelake-server": (X86, _X86_V4, 48 * KIB, 1280 * KIB, 1536 * KIB),
    "tigerlake": (X86, _X86_V4, 48 * KIB, 1280 * KIB, 3 * MIB),
    "sapphirerapids": (X86, _X86_V4, 48 * KIB, 2 * MIB, 1920 * KIB),
    "znver4": (X86, _X86_V4, 32 * KIB, 1 * MIB, 4 * MIB),
    "znver5": (X86, _X86_V4, 48 * KIB, 1 * MIB, 4 * MIB),
    "generic": (ARM, _ARM_V8, 32 * KIB, 512 * KIB, 1 * MIB),
    "cortex-a72": (ARM, _ARM_V8, 32 * KIB, 512 * KIB, 0),
    "cortex-a76": (ARM, _ARM_V8, 64 * KIB, 512 * KIB, 512 * KIB),
    "neoverse-n1": (ARM, _ARM_V8, 64 * KIB, 1 * MIB, 1 * MIB),
    "neoverse-n2": (ARM, _ARM_V8, 64 * KIB, 1 * MIB, 1 * MIB),
    "neoverse-v1": (ARM, _ARM_V8, 64 * KIB, 1 * MIB, 512 * KIB),
    "neoverse-v2": (ARM, _ARM_V8, 64 * KIB, 2 * MIB, 1 * MIB),
    "apple-m1": (ARM, _ARM_V8, 128 * KIB, 4 * MIB, 1 * MIB),
    "apple-m2": (ARM, _ARM_V8, 128 * KIB, 4 * MIB, 1 * MIB),
}
DEFAULT_CACHES = (32 * KIB, 512 * KIB, 0)    # a host CPU whose caches /sys does not report
# Bytes one way of the L1 data cache holds, where the table gives no associativity: an
# x86 L1 is indexed by the address's page offset (4 KiB pages), so a way holds 4 KiB
# (32 KiB: 8 ways, 48 KiB: 12); the ARM cores named above have 16 KiB ways (64 KiB, 4 ways)
L1_WAY_BYTES = {"x86_64": 4 * KIB, "aarch64": 16 * KIB}
PAGE_BYTES = 4 * KIB            # Linux's base page on x86-64 and AArch64
# Features every CPU of an architecture has, as its Linux ABI requires (SSE2 on
# x86-64; FP and Advanced SIMD on AArch64): the host has those LLVM's detection
# does not mention (one it reports off stays off)
ARCH_BASELINE = {"x86_64": _X86_V1, "aarch64": _ARM_V8}
SHUFFLE_CHUNK_BYTES = {"x86_64": 16, "aarch64": 16}   # see Target.shuffle_chunk_bytes


@dataclass(frozen=True)
class Target:
    """What the compiler assumes about one CPU (see the module doc).

    ``vector_bytes``: the widest native vector (16 SSE / NEON, 32 AVX2, 64
    AVX-512); ``vector_registers``: the architectural count (16 SSE/AVX2, 32
    AVX-512 and NEON); ``streaming_stores``: non-temporal stores plus
    ``sfence`` (x86); ``l1_ways``: the L1 data cache's associativity (lines
    a stride of ``l1_bytes / l1_ways`` puts in one set before they evict
    each other);
    ``l3_bytes``: a core's share of the cache beyond L2 (0: none, or not
    known);
    ``threads``: :func:`default_threads` when the target was described;
    ``work_per_ns`` and ``l2_bytes_per_ns``: what one core of this machine
    does per nanosecond running the target's code, in ``runtime._work``'s
    units and in bytes read through L2, measured once per machine
    (``throughput.py``) when first asked for."""

    name: str
    triple: str
    cpu: str
    features: frozenset
    vector_bytes: int
    vector_registers: int
    fma: bool
    streaming_stores: bool
    cache_line: int
    l1_bytes: int
    l2_bytes: int
    l3_bytes: int
    l1_ways: int
    threads: int
    llvm_features: str = field(default="", compare=False, repr=False)   # as handed to LLVM
    host: bool = field(default=False, compare=False)

    @cached_property
    def work_per_ns(self) -> float:
        from .throughput import measured
        return measured(self)[0]

    @cached_property
    def l2_bytes_per_ns(self) -> float:
        from .throughput import measured
        return measured(self)[1]

    @property
    def llvm_spec(self) -> tuple:
        """``(triple, cpu, features)``: what LLVM needs to make a target machine."""
        return self.triple, self.cpu, self.llvm_features

    @property
    def arch(self) -> str:
        return self.triple.split("-", 1)[0]

    @property
    def x86(self) -> bool:
        return self.arch == "x86_64"

    @property
    def store_fence(self) -> str | None:
        """The intrinsic that orders streaming stores before later stores (x86's sfence)."""
        return "llvm.x86.sse.sfence" if self.streaming_stores else None

    @property
    def jit_link(self) -> bool:
        """Link this target's object code with LLVM's JITLink, not RuntimeDyld.
        RuntimeDyld maps an object's code, constants and GOT separately, so
        they can land more than 4 GB apart, past the reach of AArch64's
        ``adrp`` (the small code model's page-relative addressing): it then
        aborts on an assertion (llvm-project issue 71963), as it did for a
        kernel calling libgomp under QEMU.  JITLink allocates an object in one
        block.  x86-64 keeps RuntimeDyld, which te's kernels have always run with."""
        return self.arch == "aarch64"

    def scale_intrinsic(self, single: bool) -> tuple[str, int] | None:
        """``(intrinsic, lanes)`` of AVX-512's ``vscalefps`` on 16 float32
        (``single``) or ``vscalefpd`` on 8 float64 (``p 2^n`` in one
        rounding), if the target has it."""
        if "avx512f" not in self.features:
            return None
        return f"llvm.x86.avx512.mask.scalef.{'ps' if single else 'pd'}.512", 16 if single else 8

    @property
    def chained_minmax(self) -> bool:
        """Whether a float maximum or minimum (NaN if either operand is, -0
        below +0) is a chain of dependent instructions: x86 before AVX10.2 has
        no such instruction (``maxps`` returns its second operand for a NaN
        and for a pair of zeros), so LLVM tests the sign, blends twice, tests
        for NaN and selects around one ``maxps``; AArch64's ``fmax`` is the
        operation itself."""
        return self.x86

    @property
    def mask_registers(self) -> bool:
        """Whether a vector compare writes a register of lane bits (AVX-512's
        ``k`` registers) whatever the lanes' width; elsewhere it writes a
        vector of lanes as wide as the values compared, so comparing
        64-bit indices takes twice the instructions of 32-bit ones (and on
        AVX2 packs to mask 32-bit values)."""
        return "avx512f" in self.features

    @property
    def shuffle_chunk_bytes(self) -> int:
        """The widest block a shuffle moves freely: x86's AVX and AVX-512
        shuffles are cheap within a 128-bit lane (a whole SSE register) and
        NEON registers are 128 bits, so 16 on every supported target."""
        return SHUFFLE_CHUNK_BYTES.get(self.arch, 16)

    @property
    def alignment(self) -> int:
        """Bytes outputs and temporaries are aligned to: a cache line, or a
        vector when wider (codegen promises it to LLVM, the runtime allocates so)."""
        return max(self.cache_line, self.vector_bytes)

    def lanes(self, itemsize: int) -> int:
        """Elements of ``itemsize`` bytes in one native vector."""
        return max(1, self.vector_bytes // itemsize)

    def missing_on_host(self) -> str | None:
        """Why this machine cannot run code built for this target (None: it can)."""
        host = host_target()
        if self.arch != host.arch:
            return f"this machine is {host.arch}, the target is {self.arch}"
        lacking = sorted(self.features - host.features)
        if lacking:
            return f"this machine ({host.cpu}) lacks {', '.join(lacking)}"
        return None

    def __str__(self):
        isa = ("AVX-512" if "avx512f" in self.features else "AVX2" if "avx2" in self.features
               else "AVX" if "avx" in self.features else "SSE" if self.x86 else "NEON")
        return (f"{self.name}: {self.triple} cpu={self.cpu} {isa}, {self.vector_bytes}-byte vectors, "
                f"{self.vector_registers} vector registers{', FMA' if self.fma else ''}, "
                f"L1 {self.l1_bytes // KIB} KiB {self.l1_ways}-way, L2 {self.l2_bytes // KIB} KiB, "
                f"L3 {self.l3_bytes // KIB} KiB a core, {self.threads} threads")


def _describe(name, triple, cpu, features, l1, l2, l3, ways=None, llvm_features=None, host=False) -> Target:
    """A :class:`Target` from LLVM feature names: every other figure follows
    from them (the L1 ways from its size, unless ``ways`` says)."""
    features = frozenset(features)
    if llvm_features is None:
        llvm_features = ",".join(f"+{f}" for f in sorted(features))
    x86 = triple.startswith("x86_64")
    if x86:
        vector_bytes = 64 if "avx512f" in features else 32 if "avx" in features else 16
        registers = 32 if "avx512f" in features else 16
    else:
        vector_bytes, registers = 16, 32
    return Target(
        name=name, triple=triple, cpu=cpu, features=features,
        vector_bytes=vector_bytes, vector_registers=registers,
        fma="fma" in features or not x86,
        streaming_stores=x86,
        cache_line=64, l1_bytes=l1, l2_bytes=l2, l3_bytes=l3,
        l1_ways=ways or max(1, l1 // L1_WAY_BYTES.get(triple.split("-", 1)[0], 4 * KIB)),
        threads=default_threads(), llvm_features=llvm_features, host=host)


MAX_THREADS = 4096              # a thread count beyond this is a mistake (libgomp crashed at 100000)


def thread_count(value, source: str) -> int:
    """``value`` (a number, or the text of ``TE_NUM_THREADS``) as a thread count, checked."""
    try:
        n = int(value)
    except (TypeError, ValueError):
        raise ValueError(f"{source} must be a whole number of threads, got {value!r}") from None
    if not 1 <= n <= MAX_THREADS:
        raise ValueError(f"{source} must be between 1 and {MAX_THREADS} threads, got {n}")
    return n


def default_threads() -> int:
    """The threads kernels use, the one count both the schedule (which
    balances parallel loops for it, ``Target.threads``) and the runtime
    (which splits stages across it) read: ``TE_NUM_THREADS`` if set and not
    empty, else the cores this process may run on."""
    env = os.environ.get("TE_NUM_THREADS")
    if env:
        return thread_count(env, "TE_NUM_THREADS")
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def _sys_caches(root: str = "/sys/devices/system/cpu/cpu0/cache") -> tuple:
    """(L1 data bytes, L2 bytes, L3 bytes a core, L1 data ways) of CPU 0 as
    Linux reports them (the L3 over the CPUs its ``shared_cpu_list`` names);
    the defaults and None (ways derived from the size) elsewhere.

    Each cache is a directory ``index<N>``; the same directory holds other
    entries (``uevent``), listed in no set order, which are not caches."""
    def read(entry, name):
        with open(os.path.join(root, entry, name)) as f:
            return f.read().strip()

    (l1, l2, l3), ways = DEFAULT_CACHES, None
    try:
        entries = [e for e in os.listdir(root) if e.startswith("index")]
    except OSError:
        return l1, l2, l3, ways
    for entry in entries:
        try:
            level, kind, size = int(read(entry, "level")), read(entry, "type"), read(entry, "size")
            n = int(size.rstrip("KMG")) * {"K": KIB, "M": MIB, "G": 1 << 30}.get(size[-1], 1)
        except (OSError, ValueError, IndexError):
            continue
        if level == 1 and kind == "Data":
            l1 = n
            try:
                ways = int(read(entry, "ways_of_associativity")) or None
            except (OSError, ValueError):
                ways = None
        elif level == 2:
            l2 = n
        elif level == 3:
            try:
                l3 = n // _cpu_count(read(entry, "shared_cpu_list"))
            except (OSError, ValueError):
                l3 = n
    return l1, l2, l3, ways


def _cpu_count(cpu_list: str) -> int:
    """The CPUs a Linux CPU list (``0-3,8-11``) names, at least 1."""
    ranges = [part.split("-") for part in cpu_list.split(",") if part.strip()]
    return max(1, sum(int(r[-1]) - int(r[0]) + 1 for r in ranges))


_init_lock = threading.Lock()
_initialised = False


def initialise_llvm() -> None:
    """Register every LLVM target (for cross-compilation) and libm's symbols (once)."""
    global _initialised
    with _init_lock:
        if not _initialised:
            llvm.initialize_all_targets()
            llvm.initialize_all_asmprinters()
            llvm.initialize_native_asmparser()
            llvm.load_library_permanently(ctypes.util.find_library("m"))
            _initialised = True


@lru_cache(maxsize=None)
def host_target() -> Target:
    """This machine, as LLVM detects it, plus its architecture's baseline
    (:data:`ARCH_BASELINE`).  On AArch64 Linux LLVM reads the features from
    ``/proc/cpuinfo``, which can say nothing of them: QEMU's user-mode
    emulation passes the x86 host's file through, a chroot may lack ``/proc``.
    Without the baseline such a host would refuse every kernel built for a
    named AArch64 CPU (``Target.missing_on_host``).  A core's L3 share is at
    most its CPU's in :data:`CPUS`: a VM's ``/sys`` lists only the VM's CPUs
    among those sharing the L3, which other tenants use too."""
    initialise_llvm()
    triple = llvm.get_process_triple()
    detected = llvm.get_host_cpu_features()       # "-avx512f" too: a VM may hide what the CPU name implies
    baseline = {f for f in ARCH_BASELINE.get(triple.split("-", 1)[0], ()) if f not in detected}
    features = {k for k, on in detected.items() if on} | baseline
    cpu = llvm.get_host_cpu_name()
    l1, l2, l3, ways = _sys_caches()
    if cpu in CPUS:                               # a VM lists only its own CPUs as sharing the L3
        l3 = min(l3, CPUS[cpu][4])
    return _describe("host", triple, cpu, features, l1, l2, l3, ways,
                     llvm_features=detected.flatten(), host=True)


@lru_cache(maxsize=None)
def _named(name: str) -> Target:
    triple, _, cpu = name.rpartition(":")
    known = CPUS.get(cpu)
    if known is None:
        raise ValueError(f"unknown target {name!r}: te-autodiff knows 'host' and the CPUs "
                         f"{', '.join(sorted(CPUS))} (optionally 'triple:cpu')")
    default_triple, features, l1, l2, l3 = known
    triple = triple or default_triple
    if triple.split("-", 1)[0] != default_triple.split("-", 1)[0]:
        raise ValueError(f"target {name!r}: CPU '{cpu}' is not a {triple.split('-', 1)[0]} CPU")
    return _describe(name, triple, cpu, features, l1, l2, l3)


def target(name=None) -> Target:
    """``te.target``: the :class:`Target` for ``name``; ``None`` means the
    ``TE_TARGET`` environment variable if set, else this machine (``"host"``).
    A :class:`Target` is returned as it is.  An unknown name raises ``ValueError``."""
    if isinstance(name, Target):
        return name
    from_env = name is None
    if from_env:
        name = os.environ.get("TE_TARGET") or "host"
    if not isinstance(name, str):
        raise TypeError(f"target must be a CPU name or a te.Target, got {type(name).__name__}")
    name = name.strip()
    if name == "host":
        return host_target()
    initialise_llvm()
    try:
        return _named(name)
    except ValueError as e:
        raise ValueError(f"TE_TARGET: {e}" if from_env else str(e)) from None


@lru_cache(maxsize=None)
def _llvm_target(triple: str):
    return llvm.Target.from_triple(triple)


def target_machine(t: Target):
    """A new LLVM target machine for ``t`` (a JIT engine takes ownership of
    the one it is given, so each engine gets its own)."""
    initialise_llvm()
    return _llvm_target(t.triple).create_target_machine(*t.llvm_spec[1:], opt=3)


@lru_cache(maxsize=None)
def data_layout(t: Target) -> str:
    """LLVM's data layout string for ``t`` (the emitted modules declare it)."""
    return str(target_machine(t).target_data)
