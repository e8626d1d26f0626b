"""glibc's dynamic mmap threshold must not turn freed tensors into resident heap (the quickstart's update peaked a
GiB above its live memory): after :func:`bound_heap`, tensors freed below a live one leave the process's RSS;
with glibc's defaults they stay. Each case runs in a fresh process (the threshold is per process)."""

import os
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux") or os.environ.get("MALLOC_MMAP_THRESHOLD_"),
                                reason="glibc's malloc on Linux, without MALLOC_MMAP_THRESHOLD_ set")

SCRIPT = textwrap.dedent("""
    import sys
    import torch
    from ctu.engines.host_memory import bound_heap

    def rss_mib():
        for line in open("/proc/self/status"):
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024

    if sys.argv[1] == "bound":
        assert bound_heap()
    first = torch.ones(16 * 2**18)  # 16 MiB, freed: glibc's default then serves up to 16 MiB from the heap
    del first
    before = rss_mib()
    temporaries, pins = [], []
    for _ in range(12):  # 96 MiB of 8 MiB tensors (activations, logits) between small live ones (no trim from
        temporaries.append(torch.ones(8 * 2**18))  # the heap's top can free them)
        pins.append(torch.ones(1000))
    del temporaries
    print(rss_mib() - before)
""")


def kept_after_free(mode: str) -> float:
    out = subprocess.run([sys.executable, "-c", SCRIPT, mode], capture_output=True, text=True, timeout=120,
                         env={k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k != "CTU_HEAP_BOUND"})
    assert out.returncode == 0, out.stderr[-2000:]
    return float(out.stdout.strip().splitlines()[-1])


def test_freed_tensors_leave_the_rss_once_the_heap_is_bounded():
    assert kept_after_free("bound") < 16  # MiB: the 96 MiB freed went back to the system
    assert kept_after_free("default") > 80  # glibc's defaults keep them resident (the bug this guards)


def test_an_explicit_environment_setting_wins(monkeypatch):
    from ctu.engines.host_memory import bound_heap

    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", "1048576")
    assert bound_heap() is False
    monkeypatch.delenv("MALLOC_MMAP_THRESHOLD_")
    monkeypatch.setenv("CTU_HEAP_BOUND", "0")  # glibc's defaults, kept on purpose
    assert bound_heap() is False
