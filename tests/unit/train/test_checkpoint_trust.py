"""Checkpoints and exports are read back as untrusted files: data only (a pickle that would run code is refused), each
file as the manifest written last says, the step that of the folder and within trainer.max_steps; a damaged newest
checkpoint is skipped in one line for the newest intact one; an export is complete or absent."""

from __future__ import annotations

import json
import os
import random
import types

import numpy as np
import pytest
import torch

from ctu.config.schema import ConfigError
from ctu.train.checkpoint import (
    checkpoint_problem,
    list_checkpoints,
    load_checkpoint,
    load_reference,
    resolve_resume,
    save_checkpoint,
)
from ctu.train.manifest import DamagedError, manifest_problem, write_folder, write_manifest


class Touch:
    """A pickle that runs code when loaded."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return (os.system, (f"touch {self.path}",))


def trained(root, steps=(1, 2, 3), keep=3):
    model = torch.nn.Linear(3, 3)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    for step in steps:
        with torch.no_grad():
            model.weight.add_(step)
        save_checkpoint(root, step, model=model, optimizer=opt, scheduler=sched, extra={"sampler": step}, keep=keep)
    return types.SimpleNamespace(model=model, optimizer=opt, scheduler=sched)


def test_a_checkpoint_holds_a_manifest_written_last_and_plain_data(tmp_path):
    trained(tmp_path, steps=(1,))
    step = tmp_path / "step_1"
    files = json.loads((step / "manifest.json").read_text())["files"]
    assert set(files) == {"trainable.pt", "state.pt", "checkpoint.json"}
    assert files["state.pt"]["size"] == (step / "state.pt").stat().st_size and len(files["state.pt"]["sha256"]) == 64
    assert torch.serialization.get_unsafe_globals_in_checkpoint(step / "state.pt") == []  # no numpy objects
    assert checkpoint_problem(step) is None


@pytest.mark.parametrize("file", ["state.pt", "trainable.pt", "reference.pt"])
def test_a_pickle_that_runs_code_is_refused_naming_the_file(tmp_path, file):
    parts = trained(tmp_path, steps=(1,))
    step = tmp_path / "step_1"
    marker = tmp_path / "ran"
    torch.save({"optimizer": Touch(marker)}, step / file)
    write_manifest(step)  # whoever planted it wrote a matching manifest too
    with pytest.raises(DamagedError, match=f"{file}: refused: .*run as code"):
        if file == "reference.pt":
            load_reference(step)
        else:
            load_checkpoint(step, model=parts.model, optimizer=parts.optimizer, scheduler=parts.scheduler)
    assert not marker.exists()


@pytest.mark.parametrize("damage", ["zeroed", "cut", "dropped", "marker", "manifest"])
def test_a_damaged_latest_checkpoint_is_skipped_for_the_newest_intact_one(tmp_path, capsys, damage):
    parts = trained(tmp_path)
    step3 = tmp_path / "step_3"
    data = (step3 / "trainable.pt").read_bytes()
    if damage == "zeroed":
        (step3 / "trainable.pt").write_bytes(data[:100] + bytes(len(data) - 100))
    elif damage == "cut":
        (step3 / "trainable.pt").write_bytes(data[: len(data) // 2])
    elif damage == "dropped":
        torch.save({"weight": parts.model.weight.detach()}, step3 / "trainable.pt")  # the bias left out
    elif damage == "marker":
        (step3 / "checkpoint.json").write_text('{"step": 3')
    else:
        (step3 / "manifest.json").unlink()
    chosen = resolve_resume(tmp_path, "latest", max_steps=3)
    assert chosen == tmp_path / "step_2"
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("ctu: warning: checkpoint step_3 damaged, skipped (") and str(step3) in line
    assert "resuming from step_2, the newest intact one" in line
    step, extra = load_checkpoint(chosen, model=parts.model, optimizer=parts.optimizer, scheduler=parts.scheduler)
    assert step == 2 and extra == {"sampler": 2}
    with pytest.raises(DamagedError, match=f"trainer.resume: checkpoint {step3} is damaged: {step3}"):
        resolve_resume(tmp_path, str(step3))  # named: refused, never swapped for another


def test_a_dropped_tensor_is_refused_even_with_a_matching_manifest(tmp_path):
    parts = trained(tmp_path, steps=(1,))
    step = tmp_path / "step_1"
    torch.save({"weight": parts.model.weight.detach()}, step / "trainable.pt")
    write_manifest(step)
    with pytest.raises(DamagedError, match=r"trainable.pt does not hold this model's trainable tensors .*bias"):
        load_checkpoint(step, model=parts.model, optimizer=parts.optimizer, scheduler=parts.scheduler)


def test_a_step_not_its_folders_or_past_max_steps_is_refused(tmp_path):
    trained(tmp_path)
    marker = tmp_path / "step_3" / "checkpoint.json"
    marker.write_text(json.dumps({"step": 999, "manifest": "manifest.json"}))
    write_manifest(tmp_path / "step_3")
    assert "says step 999, its folder is step_3" in checkpoint_problem(tmp_path / "step_3")
    assert resolve_resume(tmp_path, "latest", max_steps=3) == tmp_path / "step_2"
    with pytest.raises(ConfigError, match=r"step_2 is at step 2, past trainer.max_steps=1"):
        resolve_resume(tmp_path, "latest", max_steps=1)
    for bad in ("-1", "true", '"3"', "[3]", "0"):
        marker.write_text(f'{{"step": {bad}}}')
        assert checkpoint_problem(tmp_path / "step_3").endswith("names no step (a positive integer 'step')")


def test_no_intact_checkpoint_is_one_error_naming_the_newest(tmp_path):
    trained(tmp_path, steps=(1, 2))
    for step in list_checkpoints(tmp_path):
        (step / "state.pt").write_bytes(b"")
    with pytest.raises(DamagedError, match=r"no intact checkpoint in .*step_2/state.pt is 0 bytes.*1 older"):
        resolve_resume(tmp_path, "latest")


def test_a_checkpoint_written_before_manifests_still_resumes(tmp_path):
    parts = trained(tmp_path, steps=(1,))
    step = tmp_path / "step_1"
    (step / "manifest.json").unlink()
    (step / "checkpoint.json").write_text('{"step": 1}')
    state = torch.load(step / "state.pt", weights_only=True)
    state["rng"]["numpy"] = np.random.get_state()  # as they were saved: a numpy array
    torch.save(state, step / "state.pt")
    assert resolve_resume(tmp_path, "latest") == step
    before = np.random.get_state()[1].copy()
    np.random.rand()
    assert load_checkpoint(step, model=parts.model, optimizer=parts.optimizer, scheduler=parts.scheduler)[0] == 1
    assert (np.random.get_state()[1] == before).all()


def test_rng_states_round_trip(tmp_path):
    parts = trained(tmp_path, steps=(1,))
    draws = (random.random(), np.random.rand(), torch.rand(1).item())
    for _ in range(3):
        random.random(), np.random.rand(), torch.rand(1)
    parts.model.weight.data.zero_()
    load_checkpoint(tmp_path / "step_1", model=parts.model, optimizer=parts.optimizer, scheduler=parts.scheduler)
    assert (random.random(), np.random.rand(), torch.rand(1).item()) == draws
    assert parts.model.weight.abs().sum() > 0


def test_an_export_is_renamed_into_place_whole_or_not_at_all(tmp_path):
    folder = tmp_path / "export"

    def good(tmp):
        (tmp / "merged").mkdir()
        (tmp / "merged" / "model.safetensors").write_bytes(b"w" * 10)
        return {"merged": str(tmp / "merged")}

    assert write_folder(folder, good) == {"merged": str(folder / "merged")}
    assert manifest_problem(folder) is None

    def full_disk(tmp):
        (tmp / "merged").mkdir()
        (tmp / "merged" / "tokenizer.json").write_bytes(b"cut")
        raise OSError(28, "No space left on device", str(tmp / "merged" / "tokenizer.json"))

    with pytest.raises(OSError, match=rf"{folder} not written \(tokenizer.json failed\): .*earlier one is kept"):
        write_folder(folder, full_disk)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["export"]  # no temporary left, the earlier export whole
    assert manifest_problem(folder) is None
    (folder / "merged" / "model.safetensors").write_bytes(b"w" * 4)
    assert "model.safetensors is 4 bytes, the manifest says 10" in manifest_problem(folder)


def test_resume_calls_a_cut_export_unfinished(tmp_path, capsys):
    from ctu.app.resume import exported

    folder = tmp_path / "export"

    def write(tmp):
        (tmp / "merged").mkdir()
        (tmp / "merged" / "config.json").write_text("{}")
        (tmp / "merged" / "model.safetensors").write_bytes(b"w" * 10)
        (tmp / "merged" / "tokenizer.json").write_bytes(b"t" * 10)

    write_folder(folder, write)
    assert exported(folder)
    (folder / "merged" / "tokenizer.json").write_bytes(b"t" * 3)  # cut by a full disk
    assert not exported(folder)
    assert "tokenizer.json is 3 bytes" in capsys.readouterr().err
    (folder / "manifest.json").unlink()  # written in place before manifests: not known to be whole
    assert not exported(folder)


def test_eval_of_a_cut_export_is_refused_naming_the_file(tmp_path, capsys):
    from ctu.app.cli import main
    from ctu.train.manifest import export_problem

    folder = tmp_path / "export"

    def write(tmp):
        (tmp / "merged").mkdir()
        (tmp / "merged" / "config.json").write_text("{}")
        (tmp / "merged" / "tokenizer.json").write_bytes(b"t" * 10)

    write_folder(folder, write)
    assert export_problem(folder / "merged") is None and export_problem("tiny-random") is None
    (folder / "merged" / "tokenizer.json").write_bytes(b"t" * 3)  # cut by a full disk
    for command in ("eval", "train"):
        assert main([command, f"model.path={folder / 'merged'}", f"run.dir={tmp_path / 'run'}"]) == 1
        err = capsys.readouterr().err
        assert err == (f"ctu: error: model.path: {folder / 'merged'} is a damaged export: "
                       f"{folder / 'merged' / 'tokenizer.json'} is 3 bytes, the manifest says 10 (cut short or altered)\n")
    assert not (tmp_path / "run").exists()
    (tmp_path / "hub").mkdir()
    (tmp_path / "hub" / "manifest.json").write_text('["not ours"]')  # a model folder's own manifest.json
    assert export_problem(tmp_path / "hub") is None


def test_an_export_that_fails_for_another_reason_keeps_its_own_message(tmp_path):
    def mismatch(tmp):
        raise RuntimeError("export name mismatch: missing=['a'] unexpected=[]")

    with pytest.raises(RuntimeError, match=r"^export name mismatch"):
        write_folder(tmp_path / "export", mismatch)
    assert list(tmp_path.iterdir()) == []
