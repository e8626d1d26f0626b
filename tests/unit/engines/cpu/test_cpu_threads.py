"""The CPU tier's threads and OpenMP waits: chosen from the affinity, the cgroup quota and the environment, the user's
settings kept, and set by ``ctu``'s entry point before torch loads (libgomp reads them only then)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ctu.engines.cpu import cpu_threads
from ctu.engines.cpu.cpu_threads import SPIN_COUNT, cgroup_quota, choose


def test_threads_are_the_affinity_capped_by_the_quota_and_waits_are_short_spins():
    c = choose(2, None, {})
    assert (c.threads, c.set_threads) == (2, True)
    assert c.env == {"GOMP_SPINCOUNT": str(SPIN_COUNT), "KMP_BLOCKTIME": "1"}
    assert c.message.startswith("threads: 2 (affinity 2, cgroup quota none; fewer while other programs are busy, for "
                                "generation and for the updates each where fewer give the same bits (checked when other programs first are)), "
                                "OpenMP waits: spin")
    assert c.share and not choose(2, None, {"CTU_CPU_THREADS": "fixed"}).share
    assert not choose(8, 2.0, {}).share  # under a binding quota the quota is this process's share
    assert not choose(2, None, {"OMP_NUM_THREADS": "2"}).share
    assert choose(8, 2.0, {}).threads == 2
    assert choose(8, 1.5, {}).threads == 2  # a part of a CPU counts as one
    assert choose(8, 0.5, {}).threads == 1
    assert choose(2, 4.0, {}).threads == 2
    assert "cgroup quota 1.5 CPUs" in choose(8, 1.5, {}).message
    assert choose(0, None, {}).threads == 1


def test_the_users_settings_are_kept_and_named():
    c = choose(2, None, {"OMP_NUM_THREADS": "1", "OMP_WAIT_POLICY": "ACTIVE"})
    assert (c.threads, c.set_threads, c.env) == (1, False, {})
    assert "OMP_NUM_THREADS kept" in c.message and "OMP_WAIT_POLICY=ACTIVE kept" in c.message
    for name in ("GOMP_SPINCOUNT", "KMP_BLOCKTIME"):
        assert choose(2, None, {name: "5"}).env == {}
    off = choose(2, None, {"CTU_CPU_THREADS": "off"})
    assert (off.env, off.set_threads) == ({}, False) and "CTU_CPU_THREADS=off" in off.message


def test_apply_never_overrides_what_is_set(monkeypatch):
    monkeypatch.setattr(cpu_threads, "affinity_cpus", lambda: 4)
    monkeypatch.setattr(cpu_threads, "cgroup_quota", lambda: 2.0)
    monkeypatch.setattr(cpu_threads, "_applied", None)
    monkeypatch.setattr(cpu_threads, "_announced", False)
    monkeypatch.delitem(sys.modules, "torch", raising=False)  # as at the entry point: nothing loaded yet
    env: dict[str, str] = {"KMP_AFFINITY": "x"}
    choice = cpu_threads.apply(env)
    assert env == {"KMP_AFFINITY": "x", "GOMP_SPINCOUNT": str(SPIN_COUNT), "KMP_BLOCKTIME": "1", "OMP_NUM_THREADS": "2"}
    assert choice.threads == 2 and cpu_threads.note() == choice.message and cpu_threads.note() is None
    user = {"OMP_NUM_THREADS": "3", "OMP_WAIT_POLICY": "PASSIVE"}
    cpu_threads.apply(user)
    assert user == {"OMP_NUM_THREADS": "3", "OMP_WAIT_POLICY": "PASSIVE"}


def test_cgroup_quota_reads_cpu_max(tmp_path):
    (tmp_path / "cpu.max").write_text("150000 100000\n")
    assert cgroup_quota(tmp_path) == 1.5
    (tmp_path / "cpu.max").write_text("max 100000\n")
    assert cgroup_quota(tmp_path) is None
    assert cgroup_quota(tmp_path / "absent") is None


PROBE = """
import builtins, json, os, sys
seen = {}
real = builtins.__import__
def spy(name, *args, **kwargs):
    if name.split(".")[0] == "torch" and "torch" not in seen:
        seen["torch"] = {k: os.environ.get(k) for k in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")}
    return real(name, *args, **kwargs)
builtins.__import__ = spy
from ctu.app.cli import main
assert "torch" not in sys.modules, "importing the CLI loaded torch"
try:
    main(sys.argv[1:])
except SystemExit:
    pass
print(json.dumps(seen))
"""


@pytest.mark.parametrize("user", [{}, {"OMP_WAIT_POLICY": "PASSIVE"}])
def test_the_cli_sets_the_waits_before_torch_is_imported(user, tmp_path):
    """A command that loads torch (``ctu plan``) finds the waits set when it first imports it; a user's is kept."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY", "KMP_BLOCKTIME", "CTU_CPU_THREADS")}
    out = subprocess.run([sys.executable, "-c", PROBE, "plan", "configs/quickstart.yaml"], capture_output=True,
                         text=True, env={**env, **user}, timeout=300, cwd=Path(__file__).resolve().parents[4])
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert "torch" in seen, out.stderr[-2000:]
    expected = {"GOMP_SPINCOUNT": str(SPIN_COUNT), "OMP_WAIT_POLICY": None} if not user else {
        "GOMP_SPINCOUNT": None, "OMP_WAIT_POLICY": "PASSIVE"}
    assert seen["torch"] == expected


def test_refresh_follows_the_cpus_this_process_may_use(monkeypatch):
    import torch

    before = torch.get_num_threads()
    monkeypatch.setattr(cpu_threads, "cgroup_quota", lambda: None)
    monkeypatch.setattr(cpu_threads, "_applied", choose(2, None, {}))
    try:
        monkeypatch.setattr(cpu_threads, "affinity_cpus", lambda: 1)  # e.g. taskset moved it to one CPU
        assert cpu_threads.refresh() == 1 and torch.get_num_threads() == 1
        assert cpu_threads.refresh() is None  # unchanged: nothing to do
        monkeypatch.setattr(cpu_threads, "_applied", choose(2, None, {"OMP_NUM_THREADS": "2"}))
        monkeypatch.setattr(cpu_threads, "affinity_cpus", lambda: 2)
        assert cpu_threads.refresh() is None and torch.get_num_threads() == 1  # the user's count is never changed
    finally:
        torch.set_num_threads(before)
