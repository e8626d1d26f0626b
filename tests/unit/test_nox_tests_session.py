"""``nox -s tests`` (README's test command): the oracle session, the vLLM CPU venv's build and lint run beside the
default tier, not after it; the vLLM CPU tests run after it; a failure anywhere fails the command naming the tier
and its log. Checked with a stand-in for ``nox.Session`` and for the background nox processes (nothing is installed
or run)."""

import threading

import nox.command
import pytest

import noxfile


class Process:
    def __init__(self, args, out, codes, started):
        name = " ".join(args)
        self.pid, self.code = 0, codes.get(name, 0)
        out.write(f"{name} output\n")
        started.set()

    def wait(self):
        return self.code

    def poll(self):
        return self.code


class Session:
    def __init__(self, beside_started, tier_fails=False, after_fails=False):
        self.beside_started, self.tier_fails, self.after_fails = beside_started, tier_fails, after_fails
        self.posargs: list[str] = []
        self.ran: list[tuple] = []
        self.saw_beside_running = False

    def run(self, *args, **kwargs):
        self.ran.append(args)
        if len(self.ran) == 1:  # the default tier
            self.saw_beside_running = self.beside_started.wait(10)
        if self.tier_fails if len(self.ran) == 1 else self.after_fails:
            raise nox.command.CommandFailed(args[0])

    def log(self, *args):
        pass

    def error(self, reason):
        raise RuntimeError(reason)


def run_tests_session(tmp_path, monkeypatch, codes=None, tier_fails=False, after_fails=False):
    monkeypatch.chdir(tmp_path)
    started = threading.Event()
    monkeypatch.setattr(noxfile, "_start", lambda args, out: Process(args, out, codes or {}, started))
    session = Session(started, tier_fails, after_fails)
    return session, lambda: noxfile.tests(session)


def test_the_other_tiers_run_while_the_default_tier_runs(tmp_path, monkeypatch, capsys):
    session, run = run_tests_session(tmp_path, monkeypatch)
    run()
    assert session.saw_beside_running
    assert session.ran[0] == ("python", "-m", "pytest", "-n", "2", "--dist", "loadfile", "-m", "not slow")
    assert session.ran[1][1:] == ("-m", "nox", "--no-install", "-s", "vllm_cpu")  # after the tier, in its built venv
    out = capsys.readouterr().out
    assert all(f"{name} output" in out for name in ("oracle", "vllm_cpu --install-only", "lint"))


@pytest.mark.parametrize("codes, tier_fails, after_fails, named", [
    ({"vllm_cpu --install-only": 1}, False, False, ["nox -s vllm_cpu --install-only (exit 1"]),
    ({}, True, False, ["the default tier"]),
    ({}, False, True, ["nox --no-install -s vllm_cpu"]),
    ({"oracle": 2, "lint": 1}, True, False, ["the default tier", "nox -s oracle (exit 2", "nox -s lint (exit 1"]),
])
def test_a_failure_in_any_tier_fails_the_command_naming_it(tmp_path, monkeypatch, codes, tier_fails, after_fails,
                                                           named):
    session, run = run_tests_session(tmp_path, monkeypatch, codes, tier_fails, after_fails)
    with pytest.raises(RuntimeError) as failed:
        run()
    assert all(n in str(failed.value) for n in named), str(failed.value)
    assert "vllm_cpu" not in str(failed.value) or "vllm_cpu --install-only" in codes or after_fails
    assert len(session.ran) == (1 if "vllm_cpu --install-only" in codes else 2)  # no vLLM tests without their venv
