"""The arithmetic and parsing behind Ray's fail-fast checks (no Ray needed): bundles against a cluster's totals and
its largest node, address parsing, the TCP probe of an address nothing listens on, the raised line of an error."""

import socket

import pytest

from ctu.distributed.ray_setup import (
    RaySetupError,
    address_endpoint,
    placement_bundles,
    probe_address,
    raised_line,
    room_problem,
)

WHAT = "the keys"


def test_bundles_that_fit_have_no_problem():
    bundles = [{"CPU": 1.0, "GPU": 0.5}, {"CPU": 0.5, "GPU": 0.5}]
    assert room_problem(bundles, {"CPU": 1.5, "GPU": 1.0}, {"CPU": 1.5, "GPU": 1.0}, WHAT) is None


def test_too_few_cpus_or_gpus_name_both_numbers():
    assert room_problem([{"CPU": 1.0}] * 8, {"CPU": 2.0}, None, WHAT) == "the keys need 8 CPUs; the Ray cluster has 2"
    bundles, _ = placement_bundles(2, 2, "split", 1.0, 1.0, gpu=1.0)  # 4 bundles of one GPU each
    assert room_problem(bundles, {"CPU": 16.0, "GPU": 2.0}, {"CPU": 16.0, "GPU": 2.0}, WHAT) == \
        "the keys need 4 GPUs; the Ray cluster has 2"
    colocated, _ = placement_bundles(2, 2, "colocated", 1.0, 1.0, gpu=1.0)  # workers share the ranks' GPUs
    assert room_problem(colocated, {"CPU": 16.0, "GPU": 2.0}, {"CPU": 16.0, "GPU": 2.0}, WHAT) is None


def test_a_bundle_larger_than_every_node_is_named():
    bundles, _ = placement_bundles(1, 3, "colocated", 1.0, 1.0, gpu=0.0)  # one bundle of 4 CPUs
    assert room_problem(bundles, {"CPU": 6.0}, {"CPU": 3.0}, WHAT) == \
        "the keys need 4 CPUs on one node; the largest node of the Ray cluster has 3"


@pytest.mark.parametrize("address,endpoint", [
    (None, None), ("auto", None), ("local", None), ("10.0.0.5:6380", ("10.0.0.5", 6380)),
    ("ray://head:10001", ("head", 10001)), ("ray://head", ("head", 10001)), ("head", ("head", 6379)),
    ("[::1]:6379", ("::1", 6379))])
def test_address_endpoint(address, endpoint):
    assert address_endpoint(address) == endpoint


@pytest.mark.parametrize("address", ["host:port", "host:0", ":6379", "host:70000"])
def test_a_malformed_address_is_named(address):
    with pytest.raises(RaySetupError, match=rf"^distributed\.address={address}: not host:port"):
        address_endpoint(address)


def test_an_address_nothing_listens_on_is_named_at_once():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(RaySetupError, match=rf"^distributed\.address=127\.0\.0\.1:{port}: no Ray cluster reachable "
                                            rf"at 127\.0\.0\.1:{port} \(.*refused.*\)"):
        probe_address(f"127.0.0.1:{port}", timeout_s=5)


def test_an_address_something_listens_on_passes_the_probe():
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        probe_address(f"127.0.0.1:{server.getsockname()[1]}", timeout_s=5)


def test_raised_line_is_what_the_actor_raised():
    text = ("The actor died because of an error raised in its creation task, ray::A.__init__() (pid=1)\n"
            "  File \"x.py\", line 7, in __init__\n    raise OSError('no model')\nOSError: no model at /m\nmore")
    assert raised_line(RuntimeError(text)) == "OSError: no model at /m"
    assert raised_line(RuntimeError("just one line\nand a second")) == "just one line"
