"""What holds of a run's outcome: per-task held-out success with bootstrap intervals in the closing table, and the
across-seed aggregation of RL's change (scripts/outcome.py) on synthetic run directories."""

import json

import pytest

from ctu.observe.report import before_after_table, run_outcome, task_successes
from ctu.observe.tracking import eval_phase, record_eval
from scripts.outcome import aggregate, main


def write_eval(run_dir, tag, step, outcomes, max_steps=6, errored=()):
    """One evaluation: ``outcomes`` maps task id -> successes of its samples; history plus trajectories.jsonl."""
    rows = [{"domain": "mini", "task_id": task, "sample": s, "reward": float(ok), "stop_reason": "done"}
            for task, oks in outcomes.items() for s, ok in enumerate(oks)]
    rows += [{"domain": "mini", "task_id": task, "sample": 9, "reward": 0.0, "stop_reason": "error"} for task in errored]
    out = run_dir / "eval" / tag
    out.mkdir(parents=True, exist_ok=True)
    (out / "trajectories.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    per_task = [sum(v) / len(v) for v in outcomes.values()]
    record_eval(run_dir, tag=tag, phase=eval_phase(tag, step, max_steps), step=step,
                success={"mini": sum(per_task) / len(per_task), "overall": sum(per_task) / len(per_task)},
                seconds=1.0, episodes=len(rows))


def run(run_dir, warm, final, before=None):
    """A run over 20 tasks: ``warm``/``final`` are the numbers of tasks that succeed (the first ones)."""
    tasks = [f"t{i:02d}" for i in range(20)]
    write_eval(run_dir, "step_0", 0, {t: [0] for t in tasks} if before is None else before)
    write_eval(run_dir, "after_sft", 0, {t: [int(i < warm)] for i, t in enumerate(tasks)})
    write_eval(run_dir, "step_6", 6, {t: [int(i < final)] for i, t in enumerate(tasks)})
    return run_dir


def test_task_successes_average_samples_and_skip_errors(tmp_path):
    write_eval(tmp_path, "step_0", 0, {"a": [1, 0, 1, 1], "b": [0, 0]}, errored=["a", "c"])
    assert task_successes(tmp_path / "eval" / "step_0") == {"mini/a": 0.75, "mini/b": 0.0}
    assert task_successes(tmp_path / "eval" / "missing") is None


def test_run_outcome_pairs_warm_start_and_final(tmp_path):
    out = run_outcome(run(tmp_path, warm=10, final=13))
    assert out["baseline"] == "after_warm_start" and out["tasks"] == 20
    assert out["warm"].mean == pytest.approx(0.5, rel=1e-12) and out["final"].mean == pytest.approx(0.65, rel=1e-12)
    change = out["change"]
    assert change.mean == pytest.approx(0.15, rel=1e-12) and 0.0 <= change.low < 0.15 < change.high
    assert change.high <= 0.35  # 3 of 20 tasks gained: Binomial(20, 0.15)'s 97.5% quantile is 6 (0.30)


def test_the_closing_table_shows_intervals_and_the_paired_change(tmp_path):
    table = before_after_table(run(tmp_path, warm=13, final=12))
    lines = table.splitlines()
    assert lines[3].split()[-1] == "0.650" and lines[4].split()[-1] == "0.600"  # the rows are unchanged
    ci_lines = [line for line in lines if "[" in line]
    assert any(line.split()[:3] == ["after", "warm", "start"] and "0.650 [" in line for line in ci_lines)
    change = next(line for line in lines if line.startswith("change"))
    assert "-0.050 [" in change and "20 tasks" in change and "contains 0" in change


def test_a_run_without_trajectories_keeps_the_old_table(tmp_path):
    for tag, step, v in (("step_0", 0, 0.0), ("after_sft", 0, 0.6), ("step_4", 4, 0.7)):
        record_eval(tmp_path, tag=tag, phase=eval_phase(tag, step, 4), step=step, success={"overall": v},
                    seconds=1.0, episodes=4)
    table = before_after_table(tmp_path)
    assert "[" not in table and table.splitlines()[-1].endswith("0.700 (final)")


def test_aggregate_over_seeds(tmp_path):
    dirs = [run(tmp_path / "seed_0", 10, 13), run(tmp_path / "seed_1", 10, 12), run(tmp_path / "seed_2", 11, 10)]
    result = aggregate(dirs)
    changes = [r["change"]["mean"] for r in result["runs"]]
    assert changes == pytest.approx([0.15, 0.10, -0.05], rel=1e-9)
    s = result["change_across_seeds"]
    assert s["mean"] == pytest.approx(0.2 / 3, rel=1e-9) and s["min"] == pytest.approx(-0.05, rel=1e-9)
    assert s["max"] == pytest.approx(0.15, rel=1e-9) and s["low"] < s["min"] and s["high"] > s["max"]
    pooled = result["change_pooled"]  # all seeds' tasks as one paired sample (60 pairs)
    assert pooled["mean"] == pytest.approx(0.2 / 3, rel=1e-9) and pooled["n"] == 60


def test_the_script_prints_mean_min_and_interval(tmp_path, capsys):
    dirs = [str(run(tmp_path / f"seed_{s}", 10, 10 + s)) for s in range(3)]
    assert main([*dirs, "--json", str(tmp_path / "outcome.json")]) == 0
    text = capsys.readouterr().out
    assert "RL change (final - warm start) over 3 seeds: mean +0.050, min +0.000, max +0.100" in text
    assert json.loads((tmp_path / "outcome.json").read_text())["change_across_seeds"]["n"] == 3


def test_a_run_without_a_final_evaluation_is_named(tmp_path):
    write_eval(tmp_path / "seed_0", "step_0", 0, {"a": [0]})
    with pytest.raises(SystemExit, match="seed_0.*final"):
        main([str(tmp_path / "seed_0")])
