"""TRL's ``SFTTrainer(assistant_only_loss=True)`` on ctu's exported SFT data (``nox -s interop_trl``).

The file is what ``ctu data export --format openai`` writes, loaded as TRL users load it
(``datasets.load_dataset("json")``); the tokenizer carries ctu's hermes template. TRL's assistant mask must be
ctu's own loss mask token for token (the greeting, ``weight: 0``, untrained), and one training step must run.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest

trl = pytest.importorskip("trl")  # only in the interop_trl venv
datasets = pytest.importorskip("datasets")

from transformers import AutoTokenizer  # noqa: E402

from ctu.rollout.chat import HERMES_TEMPLATE, ChatFormat  # noqa: E402
from ctu.train.demos import conversation_sample  # noqa: E402
from tests.support.models import save_random_model  # noqa: E402


def export(domain: str, out) -> None:
    """The user's command, as a subprocess: ``ctu data export --domain D --format openai --out FILE``."""
    subprocess.run([sys.executable, "-m", "ctu", "data", "export", "--domain", domain, "--split", "train",
                    "--format", "openai", "--out", str(out)], check=True)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    path = save_random_model(tmp_path_factory.mktemp("tiny"), max_position_embeddings=16384)
    tok = AutoTokenizer.from_pretrained(path)
    tok.chat_template = HERMES_TEMPLATE.read_text()  # ctu's template, as the README tells TRL users to set it
    tok.save_pretrained(path)
    return path


@pytest.mark.parametrize("domain", ["mini", "retail", "telecom"])
def test_trl_assistant_only_loss_trains_exactly_ctus_loss_mask(tmp_path, model_dir, domain):
    from trl import SFTConfig, SFTTrainer
    from trl.chat_template_utils import is_chat_template_stop_token_trained

    data = tmp_path / f"{domain}.jsonl"
    export(domain, data)
    records = [json.loads(line) for line in data.read_text().splitlines()][:8]
    dataset = datasets.load_dataset("json", data_files=str(data), split="train").select(range(len(records)))
    tok = AutoTokenizer.from_pretrained(model_dir)
    config = SFTConfig(output_dir=str(tmp_path / "out"), assistant_only_loss=True, max_steps=1, max_length=None,
                       per_device_train_batch_size=2, learning_rate=1e-3, report_to=[], use_cpu=True,
                       logging_steps=1, save_strategy="no", seed=0, dataloader_num_workers=0)
    trainer = SFTTrainer(model=model_dir, args=config, train_dataset=dataset, processing_class=tok)
    assert trainer.chat_template is None  # TRL keeps ctu's template: it has the generation markers
    assert is_chat_template_stop_token_trained(tok)  # TRL's own check: <|im_end|> is trained (the model learns to stop)

    chat = ChatFormat(tok, "hermes")
    rows = trainer.train_dataset
    assert len(rows) == len(records)
    for row, record in zip(rows, records, strict=True):
        sample = conversation_sample(chat, record["messages"], record["tools"])
        n = len(sample.ids)
        ids = list(row["input_ids"])
        mask = [int(label != -100) for label in row["labels"]]  # TRL folds its assistant mask into labels
        assert [label for label in row["labels"] if label != -100] == [i for i, m in zip(ids, mask, strict=True) if m]
        assert ids[:n] == sample.ids, record["task_id"]
        assert mask[:n] == [0, *sample.mask], record["task_id"]  # ctu's mask is over next-token positions
        assert not any(mask[n:])  # the user's goodbye after the last assistant turn
        greeting = chat.encode(chat.render_assistant_text(record["messages"][1]))
        assert record["messages"][1].get("weight") == 0 and sum(mask) == sum(sample.mask) > len(greeting)

    # the collator keeps those labels: -100 exactly where ctu does not train
    batch = trainer.data_collator([rows[0]])
    assert batch["labels"][0].tolist()[: len(rows[0]["labels"])] == list(rows[0]["labels"])

    if domain != "mini":
        return  # one step on the short mini conversations is enough (retail's run ~7k tokens each on a CPU)
    before = {k: v.detach().clone() for k, v in trainer.model.named_parameters()}
    result = trainer.train()
    assert math.isfinite(result.training_loss) and result.training_loss > 0
    assert any(not v.equal(before[k]) for k, v in trainer.model.named_parameters())
