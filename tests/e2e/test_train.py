"""`ctu train` end to end on CPU with tiny-random: steps, eval, checkpoints, resume equality, export, W&B, shaping."""

import hashlib
import json

import httpx
import pytest
import respx
import torch
import yaml

from ctu.app.trainer import Trainer
from ctu.config.schema import load_config
from ctu.observe.tracking import read_metrics

JUDGE = "http://shaping-judge.test/v1/chat/completions"


def judge_reply(request):
    """A deterministic stand-in for the judge service: a score derived from the conversation."""
    body = json.loads(request.content)
    digest = hashlib.sha256(body["messages"][1]["content"].encode()).digest()
    score = (digest[0] / 255) * 2 - 1
    return httpx.Response(200, json={"id": "j", "object": "chat.completion", "created": 0, "model": "j", "choices": [
        {"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": json.dumps(
            {"failure_modes": ["none"], "score": score})}}]})


def config(run_dir, *extra):
    return load_config("configs/quickstart.yaml", [
        "model.path=tiny-random", f"run.dir={run_dir}", "trainer.tasks_per_step=2", "trainer.samples_per_task=2",
        "trainer.sft_steps=0", "trainer.eval_max_tasks=2", "sampling.max_tokens=8", "env.max_turns=2",
        "trainer.ckpt_interval=1", "trainer.lr=1e-3", "shaping.enabled=true",
        "shaping.base_url=http://shaping-judge.test/v1", "shaping.api_key_env=SHAPING_KEY", *extra])


@pytest.fixture(autouse=True)
def judge(monkeypatch):
    monkeypatch.setenv("SHAPING_KEY", "sk-shaping-secret")
    with respx.mock(assert_all_called=False) as mock:
        mock.post(JUDGE).mock(side_effect=judge_reply)
        yield mock


def without_timing(rows):
    return [{k: v for k, v in r.items() if not k.startswith("timing/")} for r in rows]


def test_three_steps_with_eval_checkpoint_export_and_wandb(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    run_dir = tmp_path / "run"
    summary = Trainer(config(run_dir, "trainer.max_steps=3", "wandb.enabled=true")).run()
    rows = read_metrics(run_dir)
    assert [r["step"] for r in rows] == [1, 2, 3]
    for key in ("rollout/reward", "rollout/success", "rollout/parse_failure_rate", "rollout/turns", "train/loss",
                "train/kl", "train/entropy", "train/clip_fraction", "train/grad_norm", "train/lr",
                "timing/tokens_per_s", "per_domain/mini/reward"):
        assert key in rows[0], key
    assert any(r["train/grad_norm"] > 0 for r in rows)  # shaping made the advantages non-zero
    assert (run_dir / "checkpoints" / "step_3" / "checkpoint.json").is_file()
    assert (run_dir / "eval" / "step_0" / "report.json").is_file() and (run_dir / "eval" / "step_3" / "report.json").is_file()
    assert "eval/overall/success" in summary["before"] and (run_dir / "curves.png").is_file()
    assert (run_dir / "examples").is_dir()
    from transformers import AutoModelForCausalLM

    merged = AutoModelForCausalLM.from_pretrained(summary["export"]["merged"])
    assert sum(p.numel() for p in merged.parameters()) > 0
    assert (tmp_path / "run" / "export" / "adapter" / "adapter_config.json").is_file()
    runs = list((run_dir / "wandb").glob("offline-run-*"))
    assert len(runs) == 1 and list(runs[0].glob("*.wandb"))
    saved = (run_dir / "config.yaml").read_text()
    assert "sk-shaping-secret" not in saved and yaml.safe_load(saved)["shaping"]["api_key_env"] == "SHAPING_KEY"
    assert "sk-shaping-secret" not in (run_dir / "metrics.jsonl").read_text()


def test_resume_gives_the_same_metrics_as_an_uninterrupted_run(tmp_path, monkeypatch):
    # Bitwise equality is a CPU property: CUDA's atomic-add kernels (embedding backward) are not deterministic.
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    straight = tmp_path / "straight"
    Trainer(config(straight, "trainer.max_steps=4", "trainer.eval_before_train=false")).run()
    split = tmp_path / "split"
    Trainer(config(split, "trainer.max_steps=2", "trainer.eval_before_train=false")).run()
    Trainer(config(split, "trainer.max_steps=4", "trainer.eval_before_train=false", "trainer.resume=latest")).run()
    a, b = without_timing(read_metrics(straight)), without_timing(read_metrics(split))
    assert [r["step"] for r in b] == [1, 2, 3, 4]
    assert a == b
