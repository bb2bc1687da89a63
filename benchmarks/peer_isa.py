"""The peers' instruction set when te-autodiff is built for a narrower CPU than this one.

``TE_TARGET=haswell`` on an AVX-512 machine measures te-autodiff's AVX2 code
path.  For the run to stand for an AVX2 machine, the peers must not use
AVX-512 either: on a CPU whose AVX-512 units are full width (AMD Zen 5,
Intel server cores) a peer's AVX-512 GEMM does twice the work per
instruction of any AVX2 code.  Each library has its own switch, set in the
environment of every child process (the numpy that measures the machine
limits included):

| library | variable |
|---|---|
| PyTorch's kernels, torch.compile's generated code | ``ATEN_CPU_CAPABILITY`` |
| oneDNN (PyTorch's convolutions) | ``ONEDNN_MAX_CPU_ISA`` |
| MKL (PyTorch's matrix products) | ``MKL_ENABLE_INSTRUCTIONS`` |
| OpenBLAS (numpy's matrix products) | ``OPENBLAS_CORETYPE`` |
| numpy's own loops | ``NPY_DISABLE_CPU_FEATURES`` |
| XLA's generated code (JAX) | ``XLA_FLAGS=--xla_cpu_max_isa`` |

JAX's matrix products and convolutions run in libraries that choose their
instructions at run time (YNNPACK, Eigen) and have no such switch: they
keep using AVX-512, which the report says (:data:`UNCAPPED`).
"""
from __future__ import annotations

# te-autodiff's vector bytes -> the variables that keep the peers to that width
_CAPS = {
    32: {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2",
         "OPENBLAS_CORETYPE": "Haswell",
         "NPY_DISABLE_CPU_FEATURES": "X86_V4 AVX512_SKX AVX512_CLX AVX512_CNL AVX512_ICL AVX512_SPR",
         "XLA_FLAGS": "--xla_cpu_max_isa=AVX2"},
    16: {"ATEN_CPU_CAPABILITY": "default", "ONEDNN_MAX_CPU_ISA": "SSE41", "MKL_ENABLE_INSTRUCTIONS": "SSE4_2",
         "OPENBLAS_CORETYPE": "Nehalem",
         "NPY_DISABLE_CPU_FEATURES": "X86_V3 X86_V4 AVX512_SKX AVX512_CLX AVX512_CNL AVX512_ICL AVX512_SPR",
         "XLA_FLAGS": "--xla_cpu_max_isa=SSE4_2"},
}
UNCAPPED = ("JAX's matrix products and convolutions (YNNPACK, Eigen) choose their instructions at run time "
            "and have no switch: they may use wider vectors than the cap")


def peer_caps() -> dict:
    """The environment variables that keep the peers to te-autodiff's vector
    width, when its target (``TE_TARGET``) is narrower than this x86 machine;
    empty otherwise."""
    import te_autodiff as te

    built, host = te.target(), te.target("host")
    if not (built.x86 and host.x86) or built.vector_bytes >= host.vector_bytes:
        return {}
    return dict(_CAPS[built.vector_bytes])


def with_caps(env: dict, caps: dict) -> dict:
    """``env`` with ``caps`` added (``XLA_FLAGS`` appended to any flags already there)."""
    env = dict(env)
    for name, value in caps.items():
        env[name] = f"{env[name]} {value}" if name == "XLA_FLAGS" and env.get(name) else value
    return env
