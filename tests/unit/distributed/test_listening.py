"""What ctu's distributed set-up listens on: the trainer ranks' rendezvous on 127.0.0.1 alone, a local Ray cluster
with token authentication on, and a Ray new enough to have it."""

import os
import re
import tomllib
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[3]


def listeners(port: int) -> list[str]:
    """The local addresses (hex, as /proc/net shows them) of the sockets listening on ``port``."""
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            if state == "0A" and local.endswith(f":{port:04X}"):
                found.append(local.rsplit(":", 1)[0])
    return found


@pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="reads Linux's socket tables")
def test_the_trainer_ranks_rendezvous_listens_on_loopback_alone(monkeypatch):
    import torch.distributed as dist

    from ctu.config.schema import load_config
    from ctu.distributed.ray_trainer import TrainerRank

    class Stop(Exception):
        pass

    asked = []

    def init(backend, **kwargs):  # the process group is the outside world: recorded, and setup stops there
        asked.append(kwargs)
        raise Stop

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(dist, "init_process_group", init)
    rank = TrainerRank(load_config(None, ["model.path=tiny-random"]), 0, 1)
    endpoint = rank.endpoint()
    assert endpoint.startswith("tcp://127.0.0.1:")
    with pytest.raises(Stop):
        rank.setup(endpoint)
    port = int(endpoint.rsplit(":", 1)[1])
    assert listeners(port) == ["0100007F"]  # 127.0.0.1 only: torch's own tcp:// store listens on [::]
    del asked[:]


def test_a_local_ray_cluster_has_token_authentication_on(monkeypatch):
    from ctu.distributed.ray_setup import start_ray

    seen = {}

    class FakeRay:
        def is_initialized(self):
            return False

        def init(self, **kwargs):
            seen.update(kwargs, auth=os.environ.get("RAY_AUTH_MODE"))

    monkeypatch.delenv("RAY_AUTH_MODE", raising=False)
    assert start_ray(FakeRay(), None)
    assert seen["auth"] == "token" and seen["_node_ip_address"] == "127.0.0.1" and seen["include_dashboard"] is False


def test_ray_is_required_in_a_version_with_token_authentication():
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    (ray,) = [r for r in extras["distributed"] if r.startswith("ray")]
    low = tuple(int(x) for x in re.match(r"ray>=(\d+)\.(\d+)", ray).groups())
    assert low >= (2, 52)  # the first Ray with RAY_AUTH_MODE=token


@pytest.mark.parametrize("args", [["--host", "0.0.0.0"], ["--host=192.0.2.7"], ["--host", "::"], ["--host"],
                                  ["--host", "127.0.0.1", "--host", "0.0.0.0"]])
def test_a_launched_vllm_server_on_another_host_is_refused_in_one_line(args):
    from ctu.config.schema import ConfigError, load_config

    launch = ["engine.kind=served", "engine.launch=true", f"engine.launch_args={args}".replace("'", '"')]
    with pytest.raises(ConfigError, match=r"engine\.launch_args: --host") as caught:
        load_config(None, launch)
    assert "\n" not in str(caught.value).strip()
    load_config(None, ["engine.kind=served", "engine.launch=true", 'engine.launch_args=["--host", "127.0.0.1"]'])
