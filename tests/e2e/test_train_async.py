"""`ctu train` with trainer.max_staleness: 0 is the synchronous loop, number for number (golden numbers recorded
from the code before asynchronous RL existed, commit 3e5ec1e); 1 runs the background rollout worker end to end."""

import threading

import pytest
import respx

from ctu.app.cli import main
from ctu.app.trainer import Trainer
from ctu.config.schema import load_config
from ctu.observe.tracking import read_metrics
from tests.e2e.test_train import JUDGE, judge_reply

# Recorded from the synchronous loop (Trainer(load_config("configs/quickstart.yaml", overrides(run_dir,
# "trainer.max_steps=1"))).run() with this module's judge), first at commit 3e5ec1e before trainer.max_staleness
# existed, again when the hf sampler came to draw one number per row (the same distribution, another random stream),
# and when it came to take probabilities by one softmax (the same numbers on a Sapphire Rapids decoding with its bf16
# copy and capped at AVX2 in fp32); one step: a second step samples from weights whose fp32 update rounds by the
# CPU's kernels, and one token flipped between a Zen 4 and the same CPU capped at AVX2. Weights: sum and sum of
# squares (float64) of the trainable ones
GOLDEN = {"rollout/reward": [0.0], "rollout/shaped_reward": [-0.07647058823529412],
          "train/loss": [-4.6566128730773926e-09], "train/pg_loss": [-4.6566128730773926e-09],
          "train/grad_norm": [0.463826984167099]}
GOLDEN_WEIGHTS = {"sum": -0.7974550627668577, "sq": 74.01815920895157}


def overrides(run_dir, *extra):
    return ["model.path=tiny-random", f"run.dir={run_dir}", "trainer.tasks_per_step=2", "trainer.samples_per_task=2",
            "trainer.sft_steps=0", "trainer.sft_replay=0", "trainer.eval_max_tasks=1", "sampling.max_tokens=8", "env.max_turns=2",
            "trainer.lr=1e-3", "shaping.enabled=true", "trainer.eval_before_train=false", "trainer.export=false",
            "shaping.base_url=http://shaping-judge.test/v1", "shaping.api_key_env=SHAPING_KEY", *extra]


@pytest.fixture(autouse=True)
def judge(monkeypatch):
    monkeypatch.setenv("SHAPING_KEY", "k")
    with respx.mock(assert_all_called=False) as mock:
        mock.post(JUDGE).mock(side_effect=judge_reply)
        yield mock


def producer_threads():
    return [t for t in threading.enumerate() if t.name == "ctu-rollout-producer"]


def test_max_staleness_0_is_the_synchronous_loop_number_for_number(tmp_path, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # the numbers are the CPU path's
    started = threading.Thread.start
    names = []
    monkeypatch.setattr(threading.Thread, "start", lambda self: (names.append(self.name), started(self))[1])
    config = load_config("configs/quickstart.yaml", overrides(tmp_path / "run", "trainer.max_steps=1",
                                                              "trainer.max_staleness=0", "trainer.autocast=off"))
    trainer = Trainer(config)
    assert trainer.engine.model is trainer.policy.model and trainer.rollouts is None  # shared, as always
    trainer.run()
    rows = read_metrics(tmp_path / "run")
    # recorded in fp32 (autocast off); another CPU's fp32 kernels may round
    # the last bits differently, so floats compare relatively (the losses are ~1e-8: absolutely)
    for key, want in GOLDEN.items():
        assert [r[key] for r in rows] == pytest.approx(want, rel=1e-4, abs=1e-6), key
    assert not any(k.startswith("async/") for r in rows for k in r)
    params = [p.detach().double() for p in trainer.policy.model.parameters() if p.requires_grad]
    assert float(sum(p.sum() for p in params)) == pytest.approx(GOLDEN_WEIGHTS["sum"], rel=1e-4)
    assert float(sum(p.pow(2).sum() for p in params)) == pytest.approx(GOLDEN_WEIGHTS["sq"], rel=1e-6)
    assert "ctu-rollout-producer" not in names  # no background thread at k = 0


def test_ctu_train_three_steps_at_max_staleness_1_records_the_async_metrics(tmp_path):
    run_dir = tmp_path / "run"
    k1 = ["trainer.max_staleness=1", "trainer.tis_cap=2.0", "trainer.eval_interval=2"]  # an evaluation mid-run
    replay = ["trainer.sft_replay=2"]  # the quickstart's replayed demos ride along with stale rollouts
    assert main(["train", "configs/quickstart.yaml", *overrides(run_dir, "trainer.max_steps=3", *k1, *replay)]) == 0
    rows = read_metrics(run_dir)
    assert [r["step"] for r in rows] == [1, 2, 3] and any(k.startswith("eval/") for k in rows[1])
    for r in rows:
        assert r["rollout/trained_groups"] == 2 and r["sync/version"] == r["step"]
        assert r["rollout/replayed_demos"] == 2
        assert 0 <= r["async/staleness_mean"] <= r["async/staleness_max"] <= 1
        assert r["async/interrupted_rows"] == 0  # trainer.inflight=finish: a load stops no generation call
        for key in ("async/dropped_groups", "async/trainer_wait_s", "async/engine_busy_s", "async/engine_idle_s",
                    "async/trainer_idle_fraction", "async/engine_idle_fraction"):
            assert key in r, key
    assert (run_dir / "checkpoints" / "step_3").is_dir() and (run_dir / "eval" / "step_3" / "report.json").is_file()
    assert not producer_threads()  # the run stopped its worker


@pytest.mark.slow
def test_a_resumed_async_run_trains_first_on_the_resumed_weights_rollouts(tmp_path):
    """The rollouts in flight at a stop are not kept: the first step after a resume trains only on tokens the
    resumed weights sampled (staleness 0), and the run goes on."""
    run_dir = tmp_path / "run"
    k1 = ["trainer.max_staleness=1", "trainer.tis_cap=2.0"]
    assert main(["train", "configs/quickstart.yaml", *overrides(run_dir, "trainer.max_steps=2", *k1)]) == 0
    assert main(["train", "configs/quickstart.yaml", *overrides(run_dir, "trainer.max_steps=4", "trainer.resume=latest",
                                                                 *k1)]) == 0
    rows = read_metrics(run_dir)
    assert [r["step"] for r in rows] == [1, 2, 3, 4] and rows[2]["async/staleness_max"] == 0
