"""`ctu report` reads a run's records as resume does: a damaged line is one error naming the file and the line, a
torn last line (a write cut short) is left out of the curves."""

from __future__ import annotations

import json

from ctu.app.cli import main
from ctu.observe.tracking import read_evals, read_metrics


def _run(tmp_path, metrics: bytes):
    run = tmp_path / "run"
    (run / "eval").mkdir(parents=True)
    (run / "metrics.jsonl").write_bytes(metrics)
    (run / "eval" / "history.jsonl").write_text(json.dumps({"step": 0, "tag": "step_0", "phase": "before",
                                                             "started": 0.0, "success": {"overall": 0.0}}) + "\n")
    return run


def _row(step: int) -> bytes:
    return (json.dumps({"step": step, "rollout": {"reward": 0.5}, "train": {"loss": 0.1}}) + "\n").encode()


def test_a_damaged_line_is_one_error_naming_file_and_line(tmp_path, capsys):
    run = _run(tmp_path, _row(1) + b'{"step": 2, "rollout": {"rew\n' + _row(3))
    assert main(["report", str(run)]) == 1
    err = capsys.readouterr().err.strip()
    assert f"{run / 'metrics.jsonl'}: line 2: not JSON" in err
    assert len(err.splitlines()) == 1


def test_a_torn_last_line_is_left_out(tmp_path):
    run = _run(tmp_path, _row(1) + _row(2) + b'{"step": 3, "rollo')
    assert [r["step"] for r in read_metrics(run)] == [1, 2]
    assert [e["step"] for e in read_evals(run)] == [0]


def test_a_line_nested_5000_deep_is_one_error_naming_file_and_line(tmp_path, capsys):
    deep = b'{"step": 2, "x": ' + b"[" * 5000 + b"]" * 5000 + b"}\n"
    for where in (deep + _row(3), _row(1) + deep.rstrip(b"\n")):  # inside, and as the last line (not torn: refused)
        run = _run(tmp_path / str(len(where)), where)
        assert main(["report", str(run)]) == 1
        err = capsys.readouterr().err.strip()
        line = 1 if where.startswith(deep) else 2
        assert err == f"ctu: error: {run / 'metrics.jsonl'}: line {line}: nested too deeply to be a record"


def test_hostile_fields_are_one_error_naming_file_and_line(tmp_path, capsys):
    """Found by the CLI fuzz: a 100k-digit number, an evaluation record without its fields, a drawn metric that is
    text. Each was a traceback or a message naming no file."""
    cases = [("metrics.jsonl", b'{"step": 1, "x": ' + b"9" * 100_000 + b"}\n", "a number too long to be a record's"),
             ("metrics.jsonl", b'{"step": 1, "rollout/reward": "high"}\n', "'rollout/reward' is not a number"),
             ("eval/history.jsonl", b'{"step": 0, "tag": "../x", "phase": "before", "started": 0, "success": {}}\n',
              "'tag' is not an evaluation's folder name"),
             ("eval/history.jsonl", b'{"step": 0, "tag": "a", "phase": "before", "started": 0, "success": 1}\n',
              "'success' is not an object of numbers")]
    for i, (name, data, message) in enumerate(cases):
        run = _run(tmp_path / str(i), _row(1))
        (run / name).write_bytes(data)
        assert main(["report", str(run)]) == 1
        assert capsys.readouterr().err == f"ctu: error: {run / name}: line 1: {message}\n"
