from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def chat_format():
    from transformers import AutoTokenizer

    from ctu.engines.hf.models import smollm2_tokenizer_dir
    from ctu.rollout.chat import ChatFormat

    return ChatFormat(AutoTokenizer.from_pretrained(smollm2_tokenizer_dir()))


ORACLE_DIR = Path(__file__).resolve().parent / "oracle"


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """tests/oracle (tau2's evaluator as a live oracle, `nox -s oracle`) runs only when named on the command line."""
    if collection_path == ORACLE_DIR:
        named = [Path(a.split("::")[0]).resolve() for a in config.args]
        if not any(p == ORACLE_DIR or ORACLE_DIR in p.parents for p in named):
            return True
    return None


REPO = Path(__file__).resolve().parent.parent
TAU2_BENCH_DATA = REPO.parent / "shared" / "tau2-bench" / "data"  # tau2-bench's data beside the repository (CI)


@pytest.fixture(scope="session")
def tau2_bench_data() -> str:
    """The data folder of a tau2-bench checkout (banking_knowledge's data): $TAU2_DATA_DIR, else
    ../shared/tau2-bench/data beside the repository; the test is skipped when neither holds it."""
    import os

    for candidate in (os.environ.get("TAU2_DATA_DIR"), TAU2_BENCH_DATA):
        if candidate and (Path(candidate) / "tau2" / "domains" / "banking_knowledge" / "db.json").is_file():
            return str(candidate)
    pytest.skip(f"no tau2-bench data with banking_knowledge (set TAU2_DATA_DIR or put a checkout's data at "
                f"{TAU2_BENCH_DATA})")


@pytest.fixture(autouse=True)
def _no_remembered_secrets():
    """ctu.config.redact remembers the secrets a command is given for the whole process; a test gets a clean slate (else a
    short key one test sets would be redacted from the next test's output)."""
    from ctu.config.redact import forget

    forget()
    yield
    forget()
