"""`ctu train` stopped by one SIGINT or SIGTERM at a random moment after its first checkpoint: it stops at the next
safe point with exit 130 or 143 and one line saying where it stands, every checkpoint it wrote kept, and no step
half-recorded. The handler itself (a flag, checked between phases; a second signal kills at once) is tested at 20
random moments in tests/unit/app/test_stop.py; here two real runs by default, CTU_SIGNAL_RUNS=n for n per signal."""

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RUNS = int(os.environ.get("CTU_SIGNAL_RUNS", "1"))
SMALL = ["model.path=tiny-random", "trainer.max_steps=12", "trainer.tasks_per_step=1", "trainer.samples_per_task=2",
         "trainer.sft_steps=0", "trainer.eval_before_train=false", "trainer.eval_max_tasks=1", "trainer.export=false",
         "trainer.ckpt_interval=1", "trainer.keep_checkpoints=20", "sampling.max_tokens=4", "env.max_turns=1"]


@pytest.mark.parametrize("signum,trial", [(s, t) for s in (signal.SIGINT, signal.SIGTERM) for t in range(RUNS)])
def test_one_signal_after_the_first_checkpoint_stops_the_run_keeping_its_checkpoints(tmp_path, signum, trial):
    run_dir = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "ctu", "train", *SMALL, f"run.dir={run_dir}"], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    first = run_dir / "checkpoints" / "step_1" / "checkpoint.json"
    deadline = time.monotonic() + 300
    while not first.is_file() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(random.Random(f"{signum}-{trial}").uniform(0.0, 1.5))
    proc.send_signal(signum)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 128 + signum, err[-3000:]
    last = err.strip().splitlines()[-1]
    assert last.startswith(f"ctu: interrupted: {signal.Signals(signum).name} received; stopped "), last
    assert "continue with trainer.resume=latest (from checkpoint step_" in last
    steps = [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    checkpoints = sorted(int(p.parent.name.split("_")[1]) for p in run_dir.glob("checkpoints/step_*/checkpoint.json"))
    assert 1 <= len(steps) < 12 and steps == list(range(1, len(steps) + 1))
    assert checkpoints == steps  # every step recorded is checkpointed, none half-recorded, none deleted
