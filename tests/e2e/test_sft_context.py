"""Supervised data obeys env.max_context_tokens: a conversation longer than any rollout could be is dropped (and
counted) before the warm start, so a 1 MB message costs a tokenizer pass, never a hang."""

import json
import time

import pytest

from ctu.app.trainer import Trainer
from ctu.config.schema import load_config
from ctu.episode.data.conversations import DataError
from ctu.train.demos import fit_context
from ctu.train.update import to_sample


def config(run_dir, *extra):
    return load_config("configs/quickstart.yaml", [
        "model.path=tiny-random", f"run.dir={run_dir}", "trainer.eval_before_train=false", "trainer.export=false",
        "trainer.max_steps=1", "trainer.sft_steps=2", "trainer.sft_batch_size=3", "trainer.sft_exclude=[]", *extra])


def chat_line(user: str) -> str:
    return json.dumps({"messages": [{"role": "user", "content": user}, {"role": "assistant", "content": "Done."}]})


def test_a_1mb_message_is_dropped_with_a_count_and_the_warm_start_finishes(tmp_path, capsys):
    data = tmp_path / "sft.jsonl"
    data.write_text("\n".join([chat_line("Where is my order?"), chat_line("x " * 500_000), chat_line("Hi")]) + "\n")
    trainer = Trainer(config(tmp_path / "run", f"trainer.sft_data={data}"))
    seen, real = [], trainer.group.sft

    def spy(demos, batches, on_step=None):
        seen.append(sorted(len(d.ids) for d in demos))
        assert max(seen[-1]) <= 1024, "a conversation longer than env.max_context_tokens reached the warm start"
        return real(demos, batches, on_step)

    trainer.group.sft = spy
    started = time.process_time()
    loss = trainer.warm_start()
    assert time.process_time() - started < 60  # CPU seconds; training on the 1 MB message took > 5 min
    assert len(seen) == 1 and len(seen[0]) == 2 and loss > 0
    warnings = [line for line in capsys.readouterr().err.splitlines() if "dropped" in line]
    assert len(warnings) == 1, warnings
    assert warnings[0].startswith(f"ctu: warning: trainer.sft_data: {data}: dropped 1 of 3 conversation(s) longer "
                                  "than env.max_context_tokens=1024 tokens (longest: ")
    assert f"at {data}:2)" in warnings[0]
    trainer.lock.release()  # never run: free run.dir now


def test_fit_context_keeps_what_fits_and_refuses_when_nothing_does():
    samples = [to_sample([1] * n, [2, 3], [1, 1], [0.0, 0.0], 0.0) for n in (3, 10, 4)]
    kept, note = fit_context(samples, 6, "gold demonstrations", ["a", "b", "c"])
    assert kept == [samples[0], samples[2]]
    assert note == "gold demonstrations: dropped 1 of 3 conversation(s) longer than env.max_context_tokens=6 tokens " \
                   "(longest: 12 tokens at b)"
    assert fit_context(samples, 12, "x", ["a", "b", "c"]) == (samples, None)
    with pytest.raises(DataError, match=r"^x: dropped 3 of 3 .*; nothing is left to train on: raise "
                                        r"env\.max_context_tokens or shorten the data$"):
        fit_context(samples, 4, "x", ["a", "b", "c"])
