"""benchmarks/learning_curve.py's pure parts: --demo-kinds selection of mini's demonstrations, success split by
coverage, and each arm's change with intervals (synthetic results)."""

import pytest

from benchmarks.learning_curve import (
    arm_summary,
    behaviours,
    by_coverage,
    covered,
    demo_tasks,
    kinds_of,
    parse_arm,
    task_kind,
)
from ctu.domains import get_domain


@pytest.fixture(scope="module")
def mini():
    return get_domain("mini")


def test_demo_kinds_select_mini_train_tasks(mini):
    train = mini.split("train")
    kinds = {task_kind(t) for t in train}
    assert {"status/allowed", "cancel/allowed", "cancel/refusal", "return/refusal"} <= kinds
    chosen = demo_tasks(mini, ["status", "cancel/refusal"])
    assert chosen and {task_kind(t) for t in chosen} == {"status/allowed", "cancel/refusal"}
    assert {t.id for t in chosen} <= {t.id for t in train}
    assert len(demo_tasks(mini, ["status", "cancel", "change_address", "return"])) == len(train)
    with pytest.raises(SystemExit, match="refund"):
        demo_tasks(mini, ["refund"])


def test_coverage_split_of_held_out_success(mini):
    test = mini.split("test")
    coverage = {f"mini/{t.id}": covered(t, ["status"]) for t in test}
    tasks = {f"mini/{t.id}": 1.0 if task_kind(t).startswith("status") else 0.0 for t in test}
    assert by_coverage(tasks, coverage) == {"with_demos": 1.0, "without_demos": 0.0}
    assert by_coverage({}, coverage) == {"with_demos": None, "without_demos": None}


def points(warm, final):
    tasks = [f"mini/t{i}" for i in range(20)]
    return [{"success": warm / 20, "tasks": {t: float(i < warm) for i, t in enumerate(tasks)}},
            {"success": final / 20, "tasks": {t: float(i < final) for i, t in enumerate(tasks)}}]


def test_arm_summary_pairs_each_seed_and_spans_seeds():
    runs = [{"seed": s, "points": points(10, f)} for s, f in enumerate((14, 12, 9))]
    summary = arm_summary(runs)
    assert [s["change"] for s in summary["seeds"]] == pytest.approx([0.2, 0.1, -0.05], rel=1e-9)
    first = summary["seeds"][0]
    assert first["tasks"] == 20 and 0.0 < first["ci"][0] < 0.2 < first["ci"][1]
    across = summary["across_seeds"]
    assert across["mean"] == pytest.approx(0.25 / 3, rel=1e-9) and across["low"] < -0.05 and across["high"] > 0.2


def test_old_results_without_per_task_rates_still_summarize():
    runs = [{"seed": 0, "points": [{"success": 0.5}, {"success": 0.6}]}]
    summary = arm_summary(runs)
    assert summary["seeds"][0]["ci"] is None and summary["across_seeds"]["mean"] == pytest.approx(0.1, rel=1e-9)


def test_behaviours_count_mini_test_tasks_by_what_they_ask(mini):
    kinds = kinds_of([mini])
    test = {f"mini/{t.id}" for t in mini.split("test")}
    held_out = {key: 1.0 for key in test}
    counts = behaviours(held_out, kinds)
    assert counts == {"refusals": (14, 14), "allowed writes": (34, 34), "status requests": (12, 12)}
    refusing = {key: float(kinds[key].endswith("/refusal") or kinds[key].startswith("status/")) for key in test}
    assert behaviours(refusing, kinds) == {"refusals": (14, 14), "allowed writes": (0, 34), "status requests": (12, 12)}


def test_kinds_need_every_task_to_have_one(mini):
    class Untyped:
        name = "other"
        tasks = [type("T", (), {"id": "x", "description": "free text"})()]

    assert kinds_of([mini, Untyped()]) is None


def test_the_replay_control_is_an_arm():
    assert parse_arm("replay") == ("replay", "replay", [])
    assert parse_arm("grpo@lr:trainer.lr=3e-4") == ("grpo@lr", "grpo", ["trainer.lr=3e-4"])
    with pytest.raises(SystemExit, match="replay"):
        parse_arm("dpo")


def test_rl_own_part_pairs_rl_and_the_replay_alone_on_the_same_tasks():
    from benchmarks.learning_curve import rl_own_part

    finals = {"grpo": (16, 13), "replay": (12, 13)}  # successes of 20 at the end, seeds 0 and 1
    results = {f"{arm}/seed_{s}": {"arm": arm, "seed": s, "points": points(10, ends[s])}
               for arm, ends in finals.items() for s in (0, 1)}
    results["sft/seed_0"] = {"arm": "sft", "seed": 0, "points": points(10, 20)}  # not part of RL's own part
    part = rl_own_part(results)
    assert [s["seed"] for s in part["seeds"]] == [0, 1]
    assert [s["change"] for s in part["seeds"]] == pytest.approx([0.2, 0.0], abs=1e-12)
    assert 0.0 < part["seeds"][0]["ci"][0] < 0.2 < part["seeds"][0]["ci"][1]
    assert part["seeds"][1]["ci"] == pytest.approx([0.0, 0.0], abs=1e-12)
    assert part["across_seeds"]["mean"] == pytest.approx(0.1, rel=1e-9)
    del results["replay/seed_1"]  # a seed without its control is left out, not paired with another seed's
    assert [s["seed"] for s in rl_own_part(results)["seeds"]] == [0]
    assert rl_own_part({"grpo/seed_0": results["grpo/seed_0"]}) is None
    results["grpo@branch/seed_0"] = {"arm": "grpo@branch", "seed": 0, "points": points(10, 11)}
    assert [s["change"] for s in rl_own_part(results, "grpo@branch")["seeds"]] == pytest.approx([-0.05], abs=1e-12)


def test_refusals_drawn_counts_full_reward_episodes_of_refused_requests(mini):
    from types import SimpleNamespace

    from benchmarks.learning_curve import refusals_drawn

    kinds = kinds_of([mini])
    refused = [k for k, v in kinds.items() if v.endswith("/refusal")][:2]
    allowed = next(k for k, v in kinds.items() if v.endswith("/allowed"))
    episodes = [SimpleNamespace(domain=key.split("/")[0], task_id=key.split("/", 1)[1], success=ok)
                for key, ok in ((refused[0], True), (refused[1], False), (refused[0], False), (allowed, True))]
    assert refusals_drawn(episodes, kinds) == (1, 3)  # the allowed write's success is not a refusal
    assert refusals_drawn(episodes, None) is None
