"""`ctu train` through a served engine (engine.kind=served) against a fake vLLM server (real HTTP on 127.0.0.1, vLLM
0.33's semantics, the hf engine's tokens): every sync loads the new version into the running server, resets its
prefix cache and passes the parity probe and the version stamp; the ids trained on are the ids the server returned."""

import pytest

from ctu.app.trainer import Trainer
from ctu.config.schema import ConfigError, load_config
from ctu.engines.checks.parity import ParityError
from ctu.engines.vllm.served import ServedEngineError
from ctu.observe.tracking import read_metrics
from tests.e2e.test_train import config, judge  # noqa: F401 - judge: the autouse shaping-judge fixture (respx)
from tests.fakes.fake_vllm_server import FakeVLLMServer


@pytest.fixture(autouse=True)
def local_server_passes(judge):  # noqa: F811 - respx mocks every httpx call; the fake server is real HTTP
    judge.route(host="127.0.0.1").pass_through()


def served_config(run_dir, url, *extra):
    return config(run_dir, "engine.kind=served", f"engine.base_url={url}/v1", "model.dtype=float32",
                  "trainer.max_steps=2", "trainer.eval_before_train=false",
                  "trainer.export=false", "trainer.lr=0.05", "trainer.sft_steps=1", "trainer.sft_lr=0.05",
                  "trainer.sft_batch_size=2", *extra)


def trained_trajectories(trainer, monkeypatch):
    seen = []
    run = trainer.pool.run

    def recorded(*args, **kwargs):
        out = run(*args, **kwargs)
        seen.extend(out)
        return out

    monkeypatch.setattr(trainer.pool, "run", recorded)
    return seen


@pytest.mark.parametrize("mode", ["adapter", "merged"])
def test_ctu_train_through_a_served_engine(tmp_path, monkeypatch, mode):
    with FakeVLLMServer() as fake:
        extra = () if mode == "adapter" else ("lora.enabled=false",)
        trainer = Trainer(served_config(tmp_path / mode, fake.url, *extra))
        trajectories = trained_trajectories(trainer, monkeypatch)
        trainer.run()
    rows = read_metrics(tmp_path / mode)
    assert [r["sync/version"] for r in rows] == [1.0, 2.0]
    assert all(r["sync/logprob_max_abs_diff"] <= 1e-3 for r in rows)
    assert any(r["train/grad_norm"] > 0 for r in rows)
    loads = [e for e in fake.events if e.split(" ")[0] in ("load", "reload", "reset", "unload")]
    loads = [e.split("/")[0].rstrip() for e in loads]
    if mode == "adapter":  # v0: the sync after the supervised warm start, merged into the base first
        assert loads == ["reload", "reset", "load ctu-v0", "reset", "load ctu-v1", "reset", "unload ctu-v0",
                         "load ctu-v2", "reset", "unload ctu-v1"]
    else:
        assert [e.split(" ")[0] for e in loads] == ["reload", "reset"] * 3 and fake.weight_version == "ctu-v2"
    sampled = [t.response_ids[a:b] for t in trajectories for a, b in t.assistant_spans]
    assert sampled and all(ids in fake.returned for ids in sampled)  # token-exact: no re-tokenization
    assert not list((tmp_path / mode / "engine").iterdir())  # the weights written for the server are gone


def test_a_server_that_keeps_the_old_adapter_stops_the_run(tmp_path):
    with FakeVLLMServer() as fake:
        fake.forget_loads = True
        with pytest.raises(ParityError, match="engine weights are version 0, the trainer's are version 1"):
            Trainer(served_config(tmp_path / "run", fake.url, "trainer.sft_steps=0")).run()


def test_served_config_checks(tmp_path, monkeypatch):
    with pytest.raises(ConfigError, match="engine.base_url: engine.kind=served attaches"):
        load_config("configs/quickstart.yaml", ["engine.kind=served", f"run.dir={tmp_path}"])
    with pytest.raises(ConfigError, match=r"engine.max_loras: must be >= trainer.max_staleness \+ 1 = 3 .*got 2"):
        load_config("configs/quickstart.yaml", ["engine.kind=served", "engine.launch=true", "engine.max_loras=2",
                                                "trainer.max_staleness=2", "trainer.tis_cap=2.0", f"run.dir={tmp_path}"])
    load_config("configs/quickstart.yaml", ["engine.kind=served", "engine.launch=true", f"run.dir={tmp_path}"])


@pytest.mark.parametrize("k", [1, 2])
def test_asynchronous_training_through_a_served_engine_keeps_the_staleness_bound(tmp_path, monkeypatch, k):
    """trainer.max_staleness=k with engine.kind=served: the background worker samples from the server while the
    trainer updates; every trained token is at most k versions old, and the newest k + 1 adapters stay loaded so
    requests in flight may still name them."""
    with FakeVLLMServer(max_loras=k + 1) as fake:
        trainer = Trainer(served_config(tmp_path / "run", fake.url, "trainer.max_steps=3", f"trainer.max_staleness={k}",
                                        "trainer.tis_cap=2.0"))
        steps = []
        update = trainer.group.update

        def recorded(samples, *args, **kwargs):
            steps.append(trainer.step)
            return update(samples, *args, **kwargs)

        monkeypatch.setattr(trainer.group, "update", recorded)
        trainer.run()
        loaded = list(trainer.engine.loaded)
    rows = read_metrics(tmp_path / "run")
    assert [r["sync/version"] for r in rows] == [1.0, 2.0, 3.0] and steps == [1, 2, 3]
    for r in rows:
        assert 0 <= r["async/staleness_mean"] <= r["async/staleness_max"] <= k
        assert r["sync/logprob_max_abs_diff"] <= 1e-3
    assert loaded == [f"ctu-v{v}" for v in range(max(0, 4 - (k + 1)), 4)][-(k + 1):]


def test_a_lora_warm_start_without_the_servers_dev_mode_is_refused_before_any_work(tmp_path):
    """The warm start is merged into the base, which the server reloads only through its dev routes: without them
    the run used to crash at the first sync after minutes of evaluation and supervised steps. Refused at start,
    in one line, before the model trains or a rollout runs; without a warm start the adapter run trains."""
    with FakeVLLMServer(dev_mode=False) as fake:
        with pytest.raises(ConfigError, match=r"^trainer\.sft_steps: .*VLLM_SERVER_DEV_MODE=1.*trainer\.sft_steps=0"):
            Trainer(served_config(tmp_path / "run", fake.url, "trainer.eval_before_train=true"))
        assert not [e for e in fake.events if e.startswith(("load", "POST /v1/completions"))]
        assert not (tmp_path / "run" / "metrics.jsonl").exists()
        Trainer(served_config(tmp_path / "plain", fake.url, "trainer.sft_steps=0", "trainer.max_steps=1")).run()
    assert [r["sync/version"] for r in read_metrics(tmp_path / "plain")] == [1.0]


def test_a_server_that_acknowledges_a_merged_load_and_keeps_its_weights_stops_the_run_at_that_step(tmp_path, caplog):
    """At a learning rate whose update is below the parity probe's tolerance the version stamp (written by ctu) and
    the probe both pass; the server's own fingerprint of its tensors does not equal the trainer's."""
    with FakeVLLMServer() as fake:
        fake.keep_old_weights = True
        with pytest.raises(ParityError, match=r"engine 0 acknowledged the weights of version 1 but holds other ones"):
            Trainer(served_config(tmp_path / "run", fake.url, "lora.enabled=false", "trainer.sft_steps=0",
                                  "trainer.lr=1e-6")).run()
    assert read_metrics(tmp_path / "run") == []  # stopped at step 1's sync, before it was recorded
    with FakeVLLMServer() as honest:
        honest.worker_extension = False  # a server without the extension: said once, then version and parity only
        Trainer(served_config(tmp_path / "plain", honest.url, "lora.enabled=false", "trainer.sft_steps=0",
                              "trainer.max_steps=1")).run()
    assert "cannot fingerprint its weights" in caplog.text



@pytest.mark.parametrize("late", [False, True])
def test_a_server_that_acknowledges_an_adapter_and_answers_with_the_older_one_stops_the_run_at_that_step(tmp_path, late):
    """The load is acknowledged and the new name listed, but requests naming it are served by what was served
    before (the base for version 1; ``late``: version 1's adapter for version 2), and vLLM's reply names the model it
    resolved (``model``). The update is below the parity probe's tolerance, so only that field shows it: the run
    stops at that sync's parity probe, naming both, before the step is recorded."""
    with FakeVLLMServer() as fake:
        fake.answer_as_previous = {"ctu-v2"} if late else True
        sent, served = ("ctu-v2", "ctu-v1") if late else ("ctu-v1", "tiny-random")
        with pytest.raises(ServedEngineError, match=rf"asked for '{sent}', the reply is from '{served}'"):
            Trainer(served_config(tmp_path / "run", fake.url, "trainer.sft_steps=0", "trainer.lr=1e-6")).run()
    assert [r["sync/version"] for r in read_metrics(tmp_path / "run")] == ([1.0] if late else [])


@pytest.mark.parametrize("mode", ["abort", "continue"])
def test_partial_rollouts_through_a_served_engine(tmp_path, mode):
    """trainer.inflight=abort|continue with the background producer: every load is wrapped in the server's
    /pause?mode=abort and /resume (requests it stops are sent again: tests/unit/engines/vllm/test_engine_served_inflight.py
    pins their tokens, versions and logprobs); the run trains within the staleness bound."""
    with FakeVLLMServer() as fake:
        Trainer(served_config(tmp_path / "run", fake.url, "trainer.max_steps=3", "trainer.max_staleness=1",
                              "trainer.tis_cap=2.0", f"trainer.inflight={mode}", "sampling.max_tokens=24")).run()
    rows = read_metrics(tmp_path / "run")
    assert [r["sync/version"] for r in rows] == [1.0, 2.0, 3.0]
    assert all(r["async/staleness_max"] <= 1 and "async/interrupted_rows" in r for r in rows)
    control = [e.split(" ")[0] for e in fake.events if e.split(" ")[0] in ("pause", "resume", "load", "reload")]
    # the warm start merged into the base, then versions 0 to 3 (no load of the initial weights before the warm
    # start: a version names one set of weights)
    assert control == ["pause", "reload", "resume"] + ["pause", "load", "resume"] * 4
    assert all(e == "pause abort" for e in fake.events if e.startswith("pause"))


def test_partial_rollouts_without_the_servers_pause_routes_are_refused_before_any_work(tmp_path):
    with FakeVLLMServer(dev_mode=False) as fake:
        with pytest.raises(ConfigError, match=r"^trainer\.inflight: continue .*VLLM_SERVER_DEV_MODE=1"):
            Trainer(served_config(tmp_path / "run", fake.url, "trainer.sft_steps=0", "trainer.max_staleness=1",
                                  "trainer.tis_cap=2.0", "trainer.inflight=continue"))
        assert not [e for e in fake.events if e.startswith(("load", "complete"))]
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


def test_partial_rollouts_are_accepted_for_served_engines_and_refused_for_the_in_process_vllm(tmp_path):
    load_config("configs/quickstart.yaml", ["engine.kind=served", "engine.launch=true", "trainer.inflight=continue",
                                            f"run.dir={tmp_path}"])
    with pytest.raises(ConfigError, match=r"trainer\.inflight: abort .*engine\.kind=vllm .*LLM\.generate"):
        load_config("configs/quickstart.yaml", ["engine.kind=vllm", "trainer.inflight=abort", f"run.dir={tmp_path}"])


@pytest.mark.parametrize("mode", ["adapter", "merged"])
def test_a_launched_colocated_server_sleeps_through_each_update(tmp_path, monkeypatch, mode):
    """engine.launch=true on CUDA beside the trainer (engine.colocated): the server sleeps (level 1) once the step's
    rollouts are done, wakes its weights before the load and its KV cache after (adapter: both before), and is
    awake for the parity probe and the next rollouts. The launch is stood in for by the fake (it has the routes a
    server started with --enable-sleep-mode has)."""
    from ctu.engines.vllm import served_setup
    with FakeVLLMServer() as fake:
        class Launched:
            url = fake.url

            def stop(self):
                pass

        monkeypatch.setattr(served_setup, "launch_server", lambda config, keep: Launched())
        monkeypatch.setattr(served_setup, "server_sleeps", lambda config: True)
        extra = () if mode == "adapter" else ("lora.enabled=false",)
        Trainer(served_config(tmp_path / "run", fake.url, "engine.launch=true", "engine.base_url=null",
                              "trainer.sft_steps=0", *extra)).run()
    seen = [e.split(" /")[0] for e in fake.events]
    seen = [e for i, e in enumerate(seen) if i == 0 or seen[i - 1] != e or not e.startswith("complete")]
    if mode == "adapter":
        load = ["wake weights", "wake kv_cache", "load ctu-v1", "reset", "complete ctu-v1"]
        again = ["wake weights", "wake kv_cache", "load ctu-v2", "reset", "unload ctu-v1", "complete ctu-v2"]
        assert seen == ["complete tiny-random", "sleep 1", *load, "sleep 1", *again]
    else:
        load = ["wake weights", "reload", "wake kv_cache", "reset", "complete tiny-random"]
        assert seen == ["complete tiny-random", "sleep 1", *load, "sleep 1", *load]
    assert [r["sync/version"] for r in read_metrics(tmp_path / "run")] == [1.0, 2.0]
