"""A write cut short by a file-size limit (``ulimit -f``) or a full disk is one line naming the file and the limit,
and leaves no cut file: ``ctu eval``'s config.yaml and reports, and a checkpoint."""

import os
import resource
import subprocess
import sys

import pytest

FAST = ["model.path=tiny-random", "sampling.max_tokens=12", "env.max_turns=2", "eval.max_tasks=3"]


def limited(limit: int):
    return lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))


def run_limited(args, limit, cwd):
    env = {**os.environ, "PYTHONPATH": os.getcwd(), "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300,
                          preexec_fn=limited(limit))


@pytest.mark.parametrize("limit, cut", [(2048, "config.yaml"), (4096, "pass_k.png")])
def test_eval_under_a_file_size_limit_names_the_file_and_leaves_no_cut_file(tmp_path, limit, cut):
    result = run_limited(["-m", "ctu", "eval", *FAST, "run.dir=run"], limit, tmp_path)
    assert result.returncode == 1, result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert "Traceback" not in result.stderr
    assert last == f"ctu: error: run/{cut}: File too large (this process may write files of at most {limit} bytes " \
                   "(ulimit -f))"
    for path in (tmp_path / "run").iterdir():  # what is there is whole: no temporaries, no cut YAML
        assert ".ctu-tmp." not in path.name
        if path.name == "config.yaml":
            assert path.read_text().endswith("\n") and "agent:" in path.read_text()


def test_a_checkpoint_cut_by_a_file_size_limit_names_it_and_the_limit(tmp_path):
    code = (
        "import torch\n"
        "from ctu.train.checkpoint import save_checkpoint, list_checkpoints\n"
        "m = torch.nn.Linear(300, 300)\n"
        "opt = torch.optim.SGD(m.parameters(), lr=0.1)\n"
        "sch = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)\n"
        "try:\n"
        "    save_checkpoint('ckpt', 3, model=m, optimizer=opt, scheduler=sch, extra={})\n"
        "except OSError as exc:\n"
        "    from ctu.app.cli import _describe\n"
        "    print(_describe(exc))\n"
        "print(list_checkpoints('ckpt'))\n")
    result = run_limited(["-c", code], 100_000, tmp_path)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.strip().splitlines()
    assert lines == ["ckpt/step_3: checkpoint not written (trainable.pt failed): this process may write files of at "
                     "most 100000 bytes (ulimit -f)", "[]"]
    assert os.listdir(tmp_path / "ckpt") == []
