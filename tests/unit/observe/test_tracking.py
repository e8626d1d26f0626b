import json

import pytest

from ctu.observe.tracking import Tracker, flatten, read_metrics


def test_one_record_per_step_in_order(tmp_path):
    with Tracker(tmp_path) as t:
        t.log(1, {"rollout": {"reward": 0.5}, "loss": 1.0})
        t.log(2, {"loss": float("nan")})
        with pytest.raises(ValueError, match="one record per step"):
            t.log(2, {"loss": 0.0})
    rows = read_metrics(tmp_path)
    assert [r["step"] for r in rows] == [1, 2]
    assert rows[0]["rollout/reward"] == 0.5 and rows[1]["loss"] is None


def test_resume_drops_records_after_the_checkpoint(tmp_path):
    with Tracker(tmp_path) as t:
        for s in range(1, 6):
            t.log(s, {"x": s})
    with Tracker(tmp_path, resume_step=3) as t:
        t.log(4, {"x": 40})
    assert [(r["step"], r["x"]) for r in read_metrics(tmp_path)] == [(1, 1), (2, 2), (3, 3), (4, 40)]


def test_examples_are_clean_jsonl(tmp_path):
    t = Tracker(tmp_path)
    path = t.examples(3, [{"messages": [{"role": "user", "content": "hi"}], "reward": 1.0}])
    assert path.name == "step_3.jsonl" and json.loads(path.read_text())["reward"] == 1.0
    t.finish()
    t.finish()  # idempotent


def test_wandb_offline_run_is_finished_once_and_has_the_history(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    with Tracker(tmp_path, wandb_enabled=True, wandb_mode="offline", run_name="ctu-test",
                 config={"trainer": {"lr": 1e-5}}) as t:
        for s in (1, 2, 3):
            t.log(s, {"loss": 1.0 / s})
        run = t._wandb
    assert run is not None
    assert t._finished
    files = list((tmp_path / "wandb").glob("offline-run-*/run-*.wandb"))
    assert files, "offline run file missing"


def test_flatten():
    assert flatten({"a": {"b": {"c": 1}}, "d": 2}) == {"a/b/c": 1, "d": 2}
