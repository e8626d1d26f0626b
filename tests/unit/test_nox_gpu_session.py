"""``nox -s gpu`` installs vLLM (so tests/gpu/test_vllm_engine.py runs) and keeps the machine's CUDA torch: the
venv sees the system site packages, and a pip constraint pins torch to the version already there, so resolving
vLLM can only take that torch or fail, never replace it with a registry build. The session's commands are
checked here with a recording stand-in for ``nox.Session`` (no venv is made)."""

import pytest

import noxfile

MACHINE_TORCH = "2.13.0+cu130"


class Skipped(Exception):
    pass


class RecordingSession:
    """What the gpu session asks nox to do; ``python -c`` answers with the machine's torch (``torch``: None when
    the machine has none, ``cuda``: its CUDA version or None for a CPU build)."""

    def __init__(self, tmp_path, torch=MACHINE_TORCH, cuda="13.0"):
        self.tmp_path, self.torch, self.cuda = tmp_path, torch, cuda
        self.calls: list[tuple[str, tuple]] = []
        self.posargs: list[str] = []

    def run(self, *args, silent=False, success_codes=None, env=None, **kwargs):
        self.calls.append(("run", args))
        if args[:2] == ("python", "-c") and silent:
            if self.torch is None:
                return "none\n"
            return f"{self.torch} {self.cuda}\n"
        return ""

    def install(self, *args, **kwargs):
        self.calls.append(("install", args))

    def create_tmp(self):
        return str(self.tmp_path)

    def skip(self, reason):
        raise Skipped(reason)

    def error(self, reason):
        raise RuntimeError(reason)

    def log(self, *args):
        pass


def installs(session):
    return [args for kind, args in session.calls if kind == "install" or (args and args[0] == "pip")]


def test_the_gpu_venv_sees_the_machines_site_packages():
    assert "--system-site-packages" in noxfile.gpu.venv_params


def test_the_gpu_session_installs_the_vllm_extra_with_torch_pinned_to_the_machines(tmp_path):
    session = RecordingSession(tmp_path)
    noxfile.gpu(session)
    ctu = [args for args in installs(session) if any(a.startswith(".[") for a in args)]
    assert len(ctu) == 1 and "vllm" in ctu[0][ctu[0].index("-e") + 1]
    constraint = ctu[0][ctu[0].index("-c") + 1]
    with open(constraint) as f:
        assert f.read().split() == [f"torch=={MACHINE_TORCH}"]
    for args in installs(session):  # nothing installs torch itself (INSTALL_TORCH is the CPU pin)
        assert not any(a == "torch" or a.startswith("torch=") for a in args)
    tests = [args for kind, args in session.calls if "pytest" in args]
    assert tests and "tests/gpu" in tests[-1]


def test_the_gpu_session_checks_torch_is_still_the_machines_after_installing(tmp_path):
    session = RecordingSession(tmp_path)
    noxfile.gpu(session)
    probes = [i for i, (kind, args) in enumerate(session.calls) if args[:2] == ("python", "-c")]
    ctu = next(i for i, (kind, args) in enumerate(session.calls) if any(a.startswith(".[") for a in args))
    assert probes[0] < ctu < probes[-1]


def test_without_a_cuda_torch_the_gpu_session_skips_in_one_line(tmp_path):
    for session in (RecordingSession(tmp_path, torch=None), RecordingSession(tmp_path, cuda="None")):
        with pytest.raises(Skipped) as info:
            noxfile.gpu(session)
        assert "CUDA" in str(info.value) and "\n" not in str(info.value)
        assert not installs(session)


def test_machine_torch_parses_the_probe():
    assert noxfile.machine_torch(f"{MACHINE_TORCH} 13.0\n") == MACHINE_TORCH
    assert noxfile.machine_torch("2.13.0 None\n") is None
    assert noxfile.machine_torch("none\n") is None
