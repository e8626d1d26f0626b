"""Hostile inputs drawn by hypothesis at every command (configs and overrides, tasks files, SFT files, transcripts,
trajectories with hostile ``domain`` values, parquet files, a run's records for ``ctu report``, a human agent's
lines for ``ctu play``): each run exits 0 or 1, a failure is one line naming the key, file or line (no traceback),
nothing is written outside run.dir or --out, nothing a data line names is imported or run (a ``--data-dir`` canary
survives ``shutil:rmtree``), and each takes under 30 s.

No model loads: a config is run with ``model.path`` set to a directory that does not exist, so one that passes every
check stops at the model with one line naming it."""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from transformers import AutoTokenizer  # noqa: F401 - imported here, not inside the first timed command

from ctu.app.cli import main
from ctu.domains import get_domain
from ctu.episode.data.prompts import task_to_tau2
from ctu.episode.transcripts import gold_transcript

# CTU_FUZZ_EXAMPLES=200 HYPOTHESIS_PROFILE=explore draws more, and new ones
FUZZ = settings(max_examples=int(os.environ.get("CTU_FUZZ_EXAMPLES", "12")), deadline=None,
                suppress_health_check=list(HealthCheck))
MODEL = "/nonexistent/model"
MINI = get_domain("mini")
GOLD = {"task_id": MINI.tasks[0].id, "domain": "mini", "messages": gold_transcript(MINI, MINI.tasks[0])}

# values no setting wants: huge, not a number, not text, too deep, the wrong shape
HOSTILE_SCALARS = st.one_of(
    st.sampled_from([float("nan"), float("inf"), -1, 0, 2**64, 10**30, 1e30, -1e30, "", "\ud800", "x" * 300, None,
                     True, "http://localhost:99999999/v1", "http://u:p@h/x@y", "ftp://x", "mini", "../x", "nan"]),
    st.integers(), st.floats(allow_nan=True), st.text(max_size=20))
HOSTILE = st.recursive(HOSTILE_SCALARS, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                                 st.dictionaries(st.text(max_size=8), inner, max_size=3)),
                       max_leaves=6)
KEYS = ["run.seed", "sampling.seed", "trainer.lr", "trainer.sft_lr", "lora.rank", "env.domains", "env.max_turns",
        "eval.max_tasks", "user.base_url", "judge.base_url", "trainer.max_steps", "trainer.sft_steps",
        "trainer.sft_data", "env.tasks.mini", "env.weights.mini", "trainer.resume", "eval.splits", "trainer",
        "unknown.key", "model.template"]
# YAML text the parser may choke on, spliced into a config
YAML_SPLICES = st.sampled_from([b"", b"trainer:\n  lr: 0.1\n", b"run:\n  seed: " + b"9" * 5000 + b"\n",
                                b"\xff\xfe\n", b"x: " + b"[" * 3000 + b"\n", b"\t- :\n",
                                b"env:\n  domains: [mini, mini]\n", b"trainer: {lr: .nan}\n", b"!!python/object:os.system\n"])


def json_line(value) -> bytes:
    return json.dumps(value, allow_nan=True).encode()


# a data line's domain that names code: importing and calling it deleted --data-dir, exited, printed the Zen of Python
CODE_DOMAINS = ["shutil:rmtree", "sys:exit", "os:listdir", "this:x", "os:system", "builtins:exit", "os:_exit",
                "importlib:import_module", "tests.support.word_domain:load"]
ZEN = "Beautiful is better than ugly"


# a line of a JSONL data file: good, broken, deep, overlong, not UTF-8, or any JSON
LINES = st.one_of(
    st.just(json_line(GOLD)),
    st.just(json_line(GOLD).replace(b'"content": "', b'"content": "\\ud800', 1)),
    st.just(json_line({"task_id": "x", "messages": 1}).replace(b"1}", b"9" * 100_000 + b"}")),
    st.just(b'{"task_id": "a", "messages": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"),
    st.just(b'{"messages": [{"role": "user", "content": "\xff"}]}'),
    st.just(b"[" * 3000),
    st.sampled_from(CODE_DOMAINS).map(lambda d: json_line(dict(GOLD, domain=d, reward=1.0))),
    HOSTILE.map(lambda d: json_line(dict(GOLD, domain=d, reward=1.0))),
    HOSTILE.map(json_line),
    st.binary(max_size=40),
)
DATA_FILE = st.lists(LINES, min_size=0, max_size=4).map(lambda lines: b"\n".join(lines) + b"\n")


def tasks_file(draw_ids: list[str]) -> bytes:
    entries = [dict(task_to_tau2(MINI.tasks[i % len(MINI.tasks)]), id=task_id) for i, task_id in enumerate(draw_ids)]
    return json.dumps(entries).encode()


TASKS_FILE = st.one_of(DATA_FILE, st.lists(st.sampled_from(["a", "b", "c", "\ud800"]), max_size=4).map(tasks_file))


def files_under(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


def canary(workdir: Path) -> str:
    """A ``--data-dir`` holding one file: a data line whose domain is ``shutil:rmtree`` deleted it."""
    (workdir / "canary").mkdir(exist_ok=True)
    (workdir / "canary" / "keep").write_text("x")
    return "canary"


def run_cli(workdir: Path, argv: list[str], capsys, allowed=("run", "out")) -> tuple[int, str]:
    """``main(argv)`` in ``workdir``: exit 0 or 1, under 30 s, no traceback, one error line, nothing written outside
    ``allowed``, nothing deleted, nothing a data line names run. Returns (exit status, the error line or '')."""
    before = files_under(workdir)
    old = os.getcwd()
    os.chdir(workdir)
    start = time.monotonic()
    try:
        code = main(argv)
    finally:
        os.chdir(old)
    took = time.monotonic() - start
    out, err = capsys.readouterr()
    assert took < 30, (argv, took)
    assert before <= files_under(workdir), (argv, before - files_under(workdir))  # nothing deleted
    assert ZEN not in out + err, argv
    assert code in (0, 1), (argv, code, err[-2000:])
    assert "Traceback" not in err, (argv, err[-3000:])
    new = {p for p in files_under(workdir) - before if p.split(os.sep)[0] not in allowed}
    assert not new, (argv, new)
    errors = [line for line in err.splitlines() if line.startswith("ctu: error") or line.startswith("ctu: config error")]
    assert len(errors) <= 1, (argv, errors)
    if code == 1 and argv[0] != "score" and argv[:2] != ["env", "check"]:
        assert len(errors) == 1, (argv, err[-2000:])
    return code, errors[0] if errors else ""


SECTIONS = "model|engine|sampling|user|env|filters|eval|judge|run|trainer|lora|wandb|shaping|distributed|agent"
NAMED = re.compile(rf"\b({SECTIONS})(\.[a-z_]+|\[\d+\]|:)|key '|override '|--[a-z-]+|\S+:\d+|/nonexistent/model|domain '|split '|\.(jsonl|json|yaml|parquet)")


def assert_named(line: str) -> None:
    """The error names something: a dotted key, an option, FILE:LINE, the model, a domain, split or file."""
    assert not line or NAMED.search(line), line
    assert len(line) < 3000, line[:300]


def write(workdir: Path, name: str, data: bytes) -> str:
    (workdir / name).write_bytes(data)
    return name


@pytest.mark.parametrize("command", ["train", "eval", "plan"])
@FUZZ
@given(splice=YAML_SPLICES, tree=st.dictionaries(st.sampled_from(KEYS), HOSTILE, max_size=3),
       overrides=st.lists(st.tuples(st.sampled_from(KEYS), HOSTILE), max_size=2), data=DATA_FILE, tasks=TASKS_FILE)
def test_config_commands_survive_hostile_configs(tmp_path_factory, capsys, command, splice, tree, overrides, data,
                                                 tasks):
    workdir = tmp_path_factory.mktemp("cwd")
    write(workdir, "sft.jsonl", data)
    write(workdir, "tasks.json", tasks)
    nested: dict = {}
    for key, value in tree.items():
        node = nested
        *parents, last = key.split(".")
        for part in parents:
            node = node.setdefault(part, {}) if isinstance(node.get(part, {}), dict) else {}
        node[last] = "sft.jsonl" if last == "sft_data" else "tasks.json" if key == "env.tasks.mini" else value
    try:
        text = yaml.safe_dump(nested, allow_unicode=True).encode("utf-8", "surrogatepass")
    except yaml.YAMLError:
        text = b""
    config = write(workdir, "c.yaml", text + splice)
    argv = [command, config, *(f"{k}={json.dumps(v, ensure_ascii=False, allow_nan=True)}" for k, v in overrides),
            f"model.path={MODEL}", "run.dir=run", "wandb.enabled=false"]
    argv = [a.encode("utf-8", "surrogatepass").decode("utf-8", "replace") for a in argv]
    _, line = run_cli(workdir, argv, capsys)
    assert_named(line)


@FUZZ
@given(data=DATA_FILE, as_json=st.booleans())
def test_score_survives_hostile_transcripts(tmp_path_factory, capsys, data, as_json):
    workdir = tmp_path_factory.mktemp("cwd")
    path = write(workdir, "t.jsonl", data)
    old = os.getcwd()
    os.chdir(workdir)
    try:
        code = main(["score", "--domain", "mini", path, "--data-dir", canary(workdir), *(["--json"] if as_json else [])])
    finally:
        os.chdir(old)
    captured = capsys.readouterr()
    assert code in (0, 1) and "Traceback" not in captured.err, captured.err[-3000:]
    assert (workdir / "canary" / "keep").is_file() and ZEN not in captured.out
    for line in captured.err.splitlines():  # every bad line is named by FILE:LINE, the summary says how many
        assert line.startswith(f"{path}:") or line.startswith("scored "), line[:300]
    assert code == (1 if f"{path}:" in captured.err else 0)


@FUZZ
@given(data=DATA_FILE, min_reward=st.one_of(st.floats(allow_nan=True), st.sampled_from(["nan", "1e999", "x"])),
       fmt=st.sampled_from(["openai", "sharegpt", "parquet"]), domain=st.sampled_from([None, "mini", "nope", "a:b"]))
def test_data_export_survives_hostile_trajectories(tmp_path_factory, capsys, data, min_reward, fmt, domain):
    workdir = tmp_path_factory.mktemp("cwd")
    (workdir / "evalrun").mkdir()
    write(workdir, "evalrun/trajectories.jsonl", data)
    where = ["--domain", domain] if domain else ["--trajectories", "evalrun"]
    argv = ["data", "export", *where, "--format", fmt, "--out", "out/o.jsonl", f"--min-reward={min_reward}",
            "--data-dir", canary(workdir)]
    try:
        code, line = run_cli(workdir, argv, capsys)
    except SystemExit as exc:  # argparse refused --min-reward (not a float): exit 2, its usage message
        assert exc.code == 2
        capsys.readouterr()
        return
    assert_named(line)


@FUZZ
@given(rows=st.lists(st.tuples(st.sampled_from(["mini", "../x", "a/b", "", "\ud800", "ok"]),
                                st.sampled_from(["a", "a", "b", "", "\ud800"]), st.sampled_from(["train", "test", ""])),
                      max_size=4),
       garbage=st.one_of(st.none(), st.binary(max_size=64)))
def test_data_import_survives_hostile_parquet(tmp_path_factory, capsys, rows, garbage):
    from ctu.episode.data.prompts import task_rows, write_prompts

    workdir = tmp_path_factory.mktemp("cwd")
    if garbage is not None:
        write(workdir, "p.parquet", garbage)
    else:
        table = []
        for domain, task_id, split in rows:
            (row,) = task_rows(MINI, [MINI.tasks[0]])
            row["extra_info"].update(domain=domain, split=split)
            row["extra_info"]["task_id"] = task_id
            table.append(row)
        try:
            write_prompts(workdir / "p.parquet", json.loads(json.dumps(table).replace("\\ud800", "\\ufffd")),
                          allow_empty=True)
        except Exception:  # not writable as parquet: the import then reads garbage
            write(workdir, "p.parquet", b"PAR1")
    code, line = run_cli(workdir, ["data", "import", "p.parquet", "--out", "out"], capsys)
    assert_named(line)


@FUZZ
@given(split=st.one_of(st.sampled_from(["train", "test", "all", "nope", ""]), st.text(max_size=8)),
       tasks=TASKS_FILE, splits=DATA_FILE)
def test_env_check_survives_hostile_data_dirs(tmp_path_factory, capsys, split, tasks, splits):
    workdir = tmp_path_factory.mktemp("cwd")
    folder = workdir / "data" / "tau2" / "domains" / "airline"
    folder.mkdir(parents=True)
    write(folder, "db.json", b"{}")  # an empty DB: quick to load; the drawn tasks are what is hostile
    write(folder, "policy.md", b"policy")
    write(folder, "tasks.json", tasks)
    write(folder, "split_tasks.json", splits)
    for argv in (["env", "check", "mini", "--split", split], ["env", "check", "airline", "--data-dir", "data"]):
        get_domain.cache_clear()
        try:
            code, line = run_cli(workdir, argv, capsys)
        finally:
            get_domain.cache_clear()
        assert_named(line)


# a run's records as ctu report reads them: good ones, ones with hostile fields, or any data line
RECORD = st.fixed_dictionaries({"step": st.one_of(st.integers(-2, 5), HOSTILE)}, optional={
    "rollout/reward": HOSTILE, "train/loss": HOSTILE, "tag": st.one_of(st.sampled_from(["step_0", "../x", "a/b"]), HOSTILE),
    "phase": st.one_of(st.sampled_from(["before", "final", "periodic", "x"]), HOSTILE),
    "started": st.one_of(st.floats(allow_nan=True), st.just(10**400), HOSTILE),
    "success": st.one_of(st.dictionaries(st.sampled_from(["overall", "mini", ""]), HOSTILE, max_size=2), HOSTILE)})
RECORDS = st.one_of(DATA_FILE, st.lists(RECORD.map(json_line), max_size=4).map(lambda ls: b"\n".join(ls) + b"\n"))


@FUZZ
@given(metrics=RECORDS, history=RECORDS, trajectories=DATA_FILE)
def test_report_survives_hostile_run_records(tmp_path_factory, capsys, metrics, history, trajectories):
    workdir = tmp_path_factory.mktemp("cwd")
    (workdir / "run" / "eval" / "step_0").mkdir(parents=True)
    write(workdir, "run/metrics.jsonl", metrics)
    write(workdir, "run/eval/history.jsonl", history)
    write(workdir, "run/eval/step_0/trajectories.jsonl", trajectories)
    code, line = run_cli(workdir, ["report", "run"], capsys, allowed=("run",))
    assert_named(line)
    assert code == 1 or (workdir / "run" / "curves.png").is_file()


@FUZZ
@given(tree=st.dictionaries(st.sampled_from(KEYS), HOSTILE, max_size=2), tasks=TASKS_FILE, typed=DATA_FILE,
       task=st.sampled_from([MINI.tasks[0].id, "nope", "../x", ""]))
def test_play_survives_hostile_configs_and_human_lines(tmp_path_factory, capsys, tree, tasks, typed, task):
    from unittest import mock

    workdir = tmp_path_factory.mktemp("cwd")
    write(workdir, "tasks.json", tasks)
    nested: dict = {}
    for key, value in tree.items():
        node = nested
        *parents, last = key.split(".")
        for part in parents:
            node = node.setdefault(part, {}) if isinstance(node.get(part, {}), dict) else {}
        node[last] = "tasks.json" if key == "env.tasks.mini" else value
    try:
        text = yaml.safe_dump(nested, allow_unicode=True).encode("utf-8", "surrogatepass")
    except yaml.YAMLError:
        text = b""
    config = write(workdir, "c.yaml", text)
    lines = [raw.decode("utf-8", "replace") for raw in typed.split(b"\n")][:6]

    def typed_in(prompt=""):
        if not lines:
            raise EOFError
        return lines.pop(0)

    argv = ["play", "--domain", "mini", "--task", task, "--human", "--config", config, f"model.path={MODEL}",
            "run.dir=run", "user.kind=scripted", "wandb.enabled=false"]
    with mock.patch("builtins.input", typed_in):
        _, line = run_cli(workdir, argv, capsys)
    assert_named(line)
