"""Ray set-ups that cannot work fail in seconds with one line naming the keys and the numbers (issue 19).

An unreachable ``distributed.address`` and a local set-up bigger than this machine fail before any cluster starts;
the rest run on one local Ray cluster with 2 CPUs: more rollout workers, or trainer ranks plus workers, than it has
CPUs; a cluster whose CPUs are all taken (a placement group holds them) times the worker start-up and the placement
group out; a worker whose build fails is named. Errors are ``RuntimeError`` one-liners."""

import os
import socket
import time

import pytest

from ctu.config.schema import load_config
from ctu.distributed.ray_pool import RayPool

FAST_S = 20.0  # "fails fast": seconds, where these set-ups used to wait 600 s or forever


@pytest.fixture(scope="module")
def ray():
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    return pytest.importorskip("ray", reason="Ray rollout workers need the distributed extra: "
                                             "pip install 'ctu[distributed]'")


def make_config(tmp_path, *extra):
    return load_config("configs/quickstart.yaml", [
        "model.path=tiny-random", f"run.dir={tmp_path / 'run'}", "sampling.max_tokens=8", "env.max_turns=2",
        "trainer.sft_steps=0", *extra])


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def one_line(exc_info) -> str:
    text = str(exc_info.value)
    assert "\n" not in text.strip(), text
    return text


# -- before any cluster starts (these run first: the module's cluster is not up yet) ------------------------------
def test_an_unreachable_address_fails_fast_naming_that_address(ray, tmp_path):
    from ctu.distributed.ray_trainer import RayTrainerGroup

    assert not ray.is_initialized()
    address = f"127.0.0.1:{closed_port()}"
    start = time.monotonic()
    with pytest.raises(RuntimeError) as got:
        RayPool(make_config(tmp_path), 1, address)
    text = one_line(got)
    assert f"distributed.address={address}" in text and f"reachable at {address}" in text
    assert "refused" in text.lower()
    config = make_config(tmp_path, f"distributed.address={address}", "distributed.trainer_workers=1")
    with pytest.raises(RuntimeError, match=rf"distributed\.address={address}: no Ray cluster reachable at {address}"):
        RayTrainerGroup(config)
    assert time.monotonic() - start < FAST_S
    assert not ray.is_initialized()


def test_a_local_set_up_bigger_than_this_machine_fails_before_ray_starts(ray, tmp_path):
    from ctu.distributed.ray_trainer import RayTrainerGroup

    assert not ray.is_initialized()
    start = time.monotonic()
    with pytest.raises(RuntimeError) as got:
        RayPool(make_config(tmp_path), 2, num_cpus=100000)
    assert "distributed.rollout_workers=2 with distributed.worker_cpus=100000 each need 200000 CPUs; this " \
           "machine (a local Ray cluster) has" in one_line(got)
    config = make_config(tmp_path, "distributed.trainer_workers=1", "distributed.rollout_workers=1",
                         "distributed.placement=split", "distributed.trainer_cpus=100000")
    with pytest.raises(RuntimeError, match=r"distributed\.trainer_workers=1 .*need 100001 CPUs; this machine"):
        RayTrainerGroup(config)
    assert time.monotonic() - start < FAST_S
    assert not ray.is_initialized()


def test_ctu_train_checks_before_loading_any_model(ray, tmp_path):
    """The trainer's preflight: the model path does not exist, yet the error is the set-up's (nothing was loaded)."""
    from ctu.app.trainer import Trainer

    address = f"127.0.0.1:{closed_port()}"
    with pytest.raises(RuntimeError, match=rf"^distributed\.address={address}: no Ray cluster reachable"):
        Trainer(make_config(tmp_path, "model.path=/nonexistent/model", f"distributed.address={address}",
                            "distributed.rollout_workers=1"))
    with pytest.raises(RuntimeError, match=r"^distributed\.trainer_workers=1 .*need 100001 CPUs; this machine"):
        Trainer(make_config(tmp_path, "model.path=/nonexistent/model", "distributed.trainer_workers=1",
                            "distributed.rollout_workers=1", "distributed.worker_cpus=100000"))
    assert not ray.is_initialized()


# -- one local cluster with 2 CPUs ----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def cluster(ray):
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, _node_ip_address="127.0.0.1")
    yield ray
    ray.shutdown()


def test_eight_rollout_workers_on_two_cpus_fail_fast(cluster, tmp_path):
    from ctu.app.trainer import Trainer

    message = "distributed.rollout_workers=8 with distributed.worker_cpus=1 each need 8 CPUs; the Ray cluster has 2"
    start = time.monotonic()
    with pytest.raises(RuntimeError) as got:
        RayPool(make_config(tmp_path), 8, num_cpus=1)
    assert one_line(got) == message
    with pytest.raises(RuntimeError) as got:  # ctu train: before the model (here: none) is loaded
        Trainer(make_config(tmp_path, "model.path=/nonexistent/model", "distributed.rollout_workers=8"))
    assert one_line(got) == message
    assert time.monotonic() - start < FAST_S


@pytest.mark.parametrize("placement,needed", [("colocated", 4), ("split", 4)])
def test_two_trainer_ranks_and_two_workers_on_two_cpus_fail_fast(cluster, tmp_path, placement, needed):
    from ctu.distributed.ray_trainer import RayTrainerGroup

    config = make_config(tmp_path, "distributed.trainer_workers=2", "distributed.rollout_workers=2",
                         f"distributed.placement={placement}")
    start = time.monotonic()
    with pytest.raises(RuntimeError) as got:
        RayTrainerGroup(config)
    assert one_line(got) == (
        "distributed.trainer_workers=2 (distributed.trainer_cpus=1 each) and distributed.rollout_workers=2 "
        f"(distributed.worker_cpus=1 each), distributed.placement={placement}, need {needed} CPUs; "
        "the Ray cluster has 2")
    assert time.monotonic() - start < FAST_S
    assert free_cpus_settle(cluster) == 2  # nothing left reserved


def free_cpus_settle(ray, want: float = 2, within_s: float = 15.0) -> float:
    """The cluster's free CPUs once they reach ``want`` (Ray releases a killed actor's asynchronously)."""
    deadline = time.monotonic() + within_s
    while (free := ray.available_resources().get("CPU", 0)) != want and time.monotonic() < deadline:
        time.sleep(0.2)
    return free


@pytest.fixture
def busy(cluster):
    """Every CPU of the cluster held by a placement group (another job's), released after the test."""
    from ray.util.placement_group import placement_group, remove_placement_group

    pg = placement_group([{"CPU": 2}])
    cluster.get(pg.ready(), timeout=60)
    yield
    remove_placement_group(pg)


def test_a_worker_that_cannot_be_scheduled_times_out_by_name(busy, cluster, tmp_path):
    start = time.monotonic()
    with pytest.raises(RuntimeError) as got:
        RayPool(make_config(tmp_path, "distributed.start_timeout_s=3"), 2, num_cpus=1)
    assert one_line(got).startswith("rollout worker 0, rollout worker 1 did not start within "
                                    "distributed.start_timeout_s=3 s")
    assert time.monotonic() - start < FAST_S


def test_a_placement_group_that_cannot_be_placed_times_out_by_name(busy, cluster, tmp_path):
    from ctu.distributed.ray_trainer import RayTrainerGroup

    config = make_config(tmp_path, "distributed.trainer_workers=1", "distributed.placement_timeout_s=3")
    start = time.monotonic()
    with pytest.raises(RuntimeError) as got:
        RayTrainerGroup(config)
    assert one_line(got).startswith(
        "the placement group for distributed.trainer_workers=1 (distributed.trainer_cpus=1 each) and "
        "distributed.rollout_workers=0 (distributed.worker_cpus=1 each), distributed.placement=colocated (1 bundle(s), "
        "1 CPUs and 0 GPUs) was not ready within distributed.placement_timeout_s=3 s; free now: 0 CPUs")
    assert time.monotonic() - start < FAST_S


def test_a_worker_that_fails_to_build_is_named_in_one_line(cluster, tmp_path):
    config = make_config(tmp_path, "model.path=/nonexistent/model")
    with pytest.raises(RuntimeError) as got:
        RayPool(config, 1, num_cpus=1, max_restarts=0)
    assert one_line(got).startswith("rollout worker 0 failed to start: ")
    assert "/nonexistent/model" in str(got.value)
    assert free_cpus_settle(cluster) == 2  # the failed worker was released
