"""What a run shows of its evaluations: the history file, curves.png's success panels, the closing table."""

import json

from ctu.observe.report import before_after_table, draw_curves, eval_points
from ctu.observe.tracking import Tracker, eval_phase, read_evals, record_eval


def history(run_dir, values=((0.0, 0.0), (0.65, 0.6), (0.5, 0.55), (0.7, 0.75)), steps=(0, 0, 2, 4)):
    tags = ("step_0", "after_sft", "step_2", "step_4")
    for tag, step, (mini, overall) in zip(tags, steps, values, strict=True):
        record_eval(run_dir, tag=tag, phase=eval_phase(tag, step, 4), step=step,
                    success={"mini": mini, "overall": overall}, seconds=1.0, episodes=20)


def test_phases_of_a_runs_evaluations():
    assert [eval_phase(t, s, 4) for t, s in (("step_0", 0), ("after_sft", 0), ("step_2", 2), ("step_4", 4))] == \
           ["before", "after_warm_start", "periodic", "final"]


def test_history_points_are_against_step_and_wall_time(tmp_path):
    history(tmp_path)
    evals = read_evals(tmp_path)
    assert [e["phase"] for e in evals] == ["before", "after_warm_start", "periodic", "final"]
    points = eval_points(evals, "overall")
    assert [p["step"] for p in points] == [0, 0, 2, 4] and [p["success"] for p in points] == [0.0, 0.6, 0.55, 0.75]
    assert points[0]["minutes"] == 0.0 and all(b["minutes"] >= a["minutes"] for a, b in zip(points, points[1:], strict=False))


def test_curves_include_the_evaluations_even_without_training_steps(tmp_path):
    history(tmp_path)
    without_metrics = draw_curves(tmp_path).stat().st_size
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "rollout/reward": 0.1 * s,
                                                                 "train/loss": 1.0 / s}) + "\n" for s in (1, 2, 3, 4)))
    with_metrics = draw_curves(tmp_path).stat().st_size
    assert without_metrics > 5_000 and with_metrics > without_metrics


def test_the_table_reads_base_warm_start_final(tmp_path):
    history(tmp_path)
    table = before_after_table(tmp_path)
    lines = table.splitlines()
    assert lines[0].split() == ["held-out", "success", "step", "min", "overall"]
    assert lines[2].split()[:3] == ["before", "training", "0"] and lines[2].split()[-1] == "0.000"
    assert lines[3].split()[:4] == ["after", "warm", "start", "0"] and lines[3].split()[-1] == "0.600"
    assert lines[4].split()[:2] == ["final", "4"] and lines[4].split()[-1] == "0.750"
    assert "overall: 0.000 (before training) -> 0.600 (after warm start) -> 0.750 (final)" in table
    assert "1 periodic evaluation(s)" in table
    assert before_after_table(tmp_path / "nothing") == "no held-out evaluation recorded"


def test_several_domains_get_a_column_each(tmp_path):
    record_eval(tmp_path, tag="step_0", phase="before", step=0, success={"mini": 0.5, "retail": 0.1, "overall": 0.3},
                seconds=1.0, episodes=4)
    assert before_after_table(tmp_path).splitlines()[0].split()[-3:] == ["mini", "retail", "overall"]


def test_resuming_drops_evaluations_after_the_checkpoint(tmp_path):
    history(tmp_path)
    with Tracker(tmp_path, resume_step=2):
        pass
    assert [e["tag"] for e in read_evals(tmp_path)] == ["step_0", "after_sft", "step_2"]
