"""Where a refusal has to be found: the policy's odds at the one token that decides it, per mini task kind.

On a mini write request (cancel, change of address, return) the agent looks the order up, then decides: call the
write tool, or tell the user the order's status (a refusal, when the status does not allow the request). The
quickstart's warm start shows no refusal (``trainer.sft_exclude: [refusal]``), so RL can learn one only from a
sampled episode that makes it. This prints, from a cached warm start, for every write-request task of a split:
the probability of the message branch at the decision token (the first token of the turn after ``get_order``'s
result), raw and at the sampling temperature, and the log-probability of the whole gold turn there; refused tasks
(where that turn is the gold refusal) against allowed ones (where the write call is gold). A refusal that RL
cannot sample in ``trainer.samples_per_task`` draws is one it cannot learn, whatever the baseline or the step size.

    python benchmarks/decision_point.py --cache runs/levers/ws10_s0_fp32.pt [--split train] [--out FILE.json] \
        [key=value ...]
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from learning_curve import task_kind  # noqa: E402
from rl_levers import from_cache  # noqa: E402

from ctu.app.trainer import Trainer  # noqa: E402
from ctu.config.schema import load_config  # noqa: E402
from ctu.train.demos import gold_samples  # noqa: E402


def turn_starts(mask: list[int]) -> list[int]:
    """Next-token positions where a trained (sampled) turn begins: mask 1 after 0."""
    return [i for i, m in enumerate(mask) if m == 1 and (i == 0 or mask[i - 1] == 0)]


def decision(model, sample, temperature: float) -> dict:
    """The decision token's probabilities (position: the second trained turn's first token) and the turn's
    log-probability, for one gold sample."""
    starts = turn_starts(sample.mask)
    if len(starts) < 2:
        raise ValueError("a write request's gold has a lookup turn and a turn after it")
    at = starts[1]
    end = next((i for i in range(at, len(sample.mask)) if sample.mask[i] == 0), len(sample.mask))
    ids = torch.tensor([sample.ids])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0].float()
    logp = torch.log_softmax(logits[at:end], dim=-1)  # the deciding turn's positions only
    token = sample.ids[at + 1]
    turn = float(logp[torch.arange(end - at), torch.tensor(sample.ids[at + 1:end + 1])].sum())
    tempered = torch.log_softmax(logits[at] / temperature, dim=-1)
    return {"token": token, "p": math.exp(float(logp[0, token])), "p_tempered": math.exp(float(tempered[token])),
            "turn_logp": turn, "turn_tokens": end - at, "top": int(logits[at].argmax())}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="configs/quickstart.yaml")
    ap.add_argument("--cache", required=True, help="the warm start's weights (.pt) and evaluation (.json)")
    ap.add_argument("--split", default="train")
    ap.add_argument("--out", help="write every task's numbers here (JSON)")
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args()
    config = load_config(args.config, ["run.dir=runs/decision_point", "run.overwrite=true",
                                       "trainer.eval_before_train=false", *args.overrides])
    trainer = Trainer(config)
    from_cache(trainer, Path(args.cache))
    model = trainer.policy.model
    model.eval()
    temperature = config.sampling.temperature
    rows = []
    for domain in trainer.domains:
        tasks = [t for t in domain.split(args.split) if not task_kind(t).startswith("status")]
        for task, sample in zip(tasks, gold_samples(trainer.chat, domain, tasks), strict=True):
            rows.append({"task": task.id, "kind": task_kind(task), **decision(model, sample, temperature)})
    # the message branch's first token on refused tasks; the write call's on allowed ones
    refused_token = collections.Counter(r["token"] for r in rows if r["kind"].endswith("/refusal")).most_common(1)[0][0]
    print(f"{len(rows)} write requests ({args.split}); temperature {temperature}; decision token of a refusal: "
          f"{trainer.chat.tokenizer.decode([refused_token])!r}")
    print(f"{'kind':<26}{'tasks':>6}{'p(gold) med':>13}{'min':>10}{'max':>10}{'at T':>10}{'greedy=gold':>13}"
          f"{'turn logp':>11}")
    by_kind: dict[str, list[dict]] = collections.defaultdict(list)
    for r in rows:
        by_kind[r["kind"]].append(r)
    for kind, rs in sorted(by_kind.items()):
        ps = sorted(r["p"] for r in rs)
        temp = sorted(r["p_tempered"] for r in rs)
        greedy = sum(r["top"] == r["token"] for r in rs)
        turn = sorted(r["turn_logp"] for r in rs)
        print(f"{kind:<26}{len(rs):>6}{ps[len(ps) // 2]:>13.2e}{ps[0]:>10.2e}{ps[-1]:>10.2e}"
              f"{temp[len(temp) // 2]:>10.2e}{greedy:>13}{turn[len(turn) // 2]:>11.2f}")
    refused = [r for r in rows if r["kind"].endswith("/refusal")]
    if refused:
        draws = config.trainer.samples_per_task
        hit = [1 - (1 - r["p_tempered"]) ** draws for r in refused]
        print(f"refused tasks: chance that {draws} draws at T={temperature} take the message branch at least once: "
              f"median {sorted(hit)[len(hit) // 2]:.2e}, mean {sum(hit) / len(hit):.2e}")
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps({"temperature": temperature, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
