"""`ctu train` given credentials in every URL-valued config key at once, and an API key in the environment, writes
none of them anywhere: not in a file under run.dir (W&B's offline run included: what `wandb sync` would upload), not
on stdout or stderr, not in what it leaves in HOME or TMPDIR. The credentials are drawn by hypothesis; the user
simulator and the shaping judge are real local HTTP servers that answer, so the run does every step. The episodes are
played by an agent of one's own (agent.command) that prints its whole environment and writes it to HOME: the agent
gets no key ctu holds, so neither its kept log nor agent/episodes.jsonl holds one."""

import json
import os
import subprocess
import sys
from pathlib import Path
from urllib.parse import quote

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ctu.engines.hf.models import cache_dir
from tests.fakes.chat_server import StubChatServer, completion

ROOT = Path(__file__).resolve().parents[2]
HOSTILE = "/#?@:;&=%'\"<>{}[](),\\|`^~$!* é☃\t"  # what a password may hold; the URL carries it percent-encoded
KEYS = ["accessToken", "api_key", "api-key", "apiKey", "token", "sig", "X-Amz-Signature", "password", "client_secret",
        "Authorization", "pwd", "key", "credential", "ACCESS_TOKEN"]
SLOTS = 9  # secrets a run gets: 3 passwords, 5 query values, 1 API key


@st.composite
def secrets(draw):
    """SLOTS secrets, each two markers (a fixed tag and drawn letters and digits: found in any file whatever its
    escaping) around every hostile character, in a drawn order, and more drawn characters."""
    out = []
    for i in range(SLOTS):
        a, b = (f"Zq{i}{side}" + draw(st.text("abcdefghijkmnpqrstuvwxyzABCDEFGHJKLMNPQRSTUVWXYZ23456789", min_size=6,
                                              max_size=10)) for side in "AB")
        middle = "".join(draw(st.permutations(HOSTILE))) + draw(st.text(st.characters(exclude_categories=("Cs",))))
        out.append((a, middle, b))
    return out


def hits(data: bytes, markers: list[str]) -> list[str]:
    return [m for m in markers if m.encode() in data]


# One run by default (the simplest draw, which already holds every hostile character and five different key names
# after both separators); CTU_SECRET_RUNS=n runs n draws (HYPOTHESIS_PROFILE=explore: new ones each time).
@settings(max_examples=int(os.environ.get("CTU_SECRET_RUNS", "1")), deadline=None,
          suppress_health_check=list(HealthCheck))
@given(drawn=secrets(), keys=st.permutations(KEYS), seps=st.permutations("&;&;&"))
def test_a_train_run_writes_no_secret_anywhere(tmp_path_factory, drawn, keys, seps):
    tmp = tmp_path_factory.mktemp("secrets")
    run_dir, home, tmpdir = tmp / "run", tmp / "home", tmp / "tmp"
    home.mkdir()
    tmpdir.mkdir()
    pw = [quote(a + m + b, safe="") for a, m, b in drawn]
    judge_reply = completion(json.dumps({"failure_modes": ["none"], "score": 0.5}))
    with StubChatServer([(200, completion("Thanks, that is all. ###STOP###"), {})]) as user, \
            StubChatServer([(200, judge_reply, {})]) as shaping:
        def url(base, password, first, second):
            return (base.replace("http://", f"http://alice:{pw[password]}@") + f"?{keys[first]}={pw[first + 3]}"
                    f"{seps[first]}model=m{seps[second]}{keys[second]}={pw[second + 3]}")

        overrides = [
            "model.path=tiny-random", f"run.dir={run_dir}", "trainer.max_steps=1", "trainer.tasks_per_step=1",
            "trainer.samples_per_task=2", "trainer.sft_steps=0", "trainer.eval_max_tasks=1",
            "trainer.eval_before_train=false", "sampling.max_tokens=4", "env.max_turns=1", "wandb.enabled=true",
            "user.kind=llm", "user.max_retries=0", "user.api_key_env=MYUSERKEY", "shaping.api_key_env=MYUSERKEY",
            f"agent.command={sys.executable} {ROOT / 'tests' / 'fakes' / 'env_agent.py'}", "agent.concurrency=1", f"user.base_url={url(user.base_url, 0, 0, 1)}",
            "shaping.enabled=true", "shaping.max_retries=0", f"shaping.base_url={url(shaping.base_url, 1, 2, 3)}",
            f"judge.base_url=https://{pw[2]}@judge.invalid/v1?{keys[4]}={pw[7]}",  # not called: recorded only
        ]
        env = {**os.environ, "WANDB_MODE": "offline", "HOME": str(home), "TMPDIR": str(tmpdir),
               "CTU_CACHE_DIR": str(cache_dir()), "OPENAI_API_KEY": f"sk-{drawn[8][0]}{pw[8]}",
               "MYUSERKEY": f"sk-{drawn[8][0]}{pw[8]}"}
        done = subprocess.run([sys.executable, "-m", "ctu", "train", *overrides], cwd=ROOT, env=env,
                              capture_output=True, timeout=600)
        assert user.requests and shaping.requests  # the URLs were used, not only recorded
    log = done.stdout + done.stderr
    assert done.returncode == 0, log.decode(errors="replace")[-3000:]
    markers = [marker for a, _, b in drawn for marker in (a, b)]
    files = [p for root in (run_dir, home, tmpdir) for p in root.rglob("*") if p.is_file()]
    assert list(run_dir.glob("wandb/offline-run-*/run-*.wandb")) and (run_dir / "config.yaml").is_file()
    assert (run_dir / "eval" / "step_1" / "trajectories.jsonl").is_file()
    assert (run_dir / "agent" / "logs" / "r0-e1.log").is_file() and (run_dir / "agent" / "episodes.jsonl").is_file()
    assert list(home.glob("agent-env-*.json"))  # the agents ran and wrote what they were given
    leaks = [f"{p}: {hits(p.read_bytes(), markers)}" for p in files if hits(p.read_bytes(), markers)]
    leaks += [f"stdout/stderr: {hits(log, markers)}"] if hits(log, markers) else []
    assert leaks == [], leaks
