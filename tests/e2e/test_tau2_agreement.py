"""`ctu score` agrees with tau2-bench's own evaluator on 1,117 reference transcripts (fixtures/tau2_reference)."""

import gzip
import json
from pathlib import Path

import pytest

from ctu.app.cli import main
from ctu.domains import get_domain
from ctu.episode.reward import score_transcript
from ctu.episode.transcripts import ending

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "tau2_reference"


def rows(domain):
    with gzip.open(FIXTURES / f"{domain}.jsonl.gz", "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f]


@pytest.mark.parametrize("domain", ["retail", "airline"])
def test_reward_and_components_match_tau2_on_every_transcript(domain):
    d = get_domain(domain)
    data = rows(domain)
    assert len(data) > 250
    disagreements = []
    for row in data:
        got = score_transcript(d, d.task(row["task_id"]), row["messages"], ending(row["messages"], row["termination"]))
        want = row["expected"]
        if (got.reward, got.components, list(got.skipped)) != (want["reward"], want["components"], want["skipped"]):
            disagreements.append((row["kind"], row["task_id"], got.reward, want["reward"], got.reasons[:2]))
    assert disagreements == []
    kinds = {r["kind"] for r in data}
    assert {"gold", "perturbed_arg", "partial", "reordered", "failing_calls", "no_stop"} <= kinds
    assert {r["expected"]["reward"] for r in data} == {0.0, 1.0}


def test_the_cli_gives_the_same_rewards(tmp_path, capsys):
    data = rows("airline")[:60]
    path = tmp_path / "airline.jsonl"
    path.write_text("".join(json.dumps({k: r[k] for k in ("task_id", "messages", "domain", "termination")}) + "\n"
                            for r in data))
    main(["score", str(path), "--json"])
    out = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [o["reward"] for o in out] == [r["expected"]["reward"] for r in data]
