"""Ray set-ups that cannot work fail fast, with one line naming the keys and the numbers.

* Joining a cluster (``distributed.address``): an explicit ``host:port`` (or ``ray://host:port``) is probed with a
  plain TCP connect first (:data:`CONNECT_TIMEOUT_S`), so an address nothing listens on fails in seconds naming
  that address (Ray itself retries for minutes and names the node's own IP in place of ``127.0.0.1``).
* Room: the CPUs/GPUs the actors reserve (per placement bundle) are checked against the cluster's
  (``ray.cluster_resources()``: totals, and the largest node for a bundle) before any actor is created; before a
  local cluster is started, against this machine.
* Start-up: every wait for actors to start is bounded (``distributed.start_timeout_s``); a worker that does not
  start in time, or fails to, is named in a one-line :class:`RaySetupError`.
* ``ctu train`` runs :func:`preflight` before it loads any model: the address probe and the room check.

Pure helpers (:func:`room_problem`, :func:`address_endpoint`) carry the arithmetic and parsing; the rest talks to
Ray, imported by the caller (``ctu`` imports without it).
"""

from __future__ import annotations

import os
import re
import socket
import time
from collections.abc import Mapping, Sequence
from typing import Any

CONNECT_TIMEOUT_S = 10.0  # a TCP connect to the cluster's address: refused at once, unanswered within this
RESOURCES = ("CPU", "GPU")


class RaySetupError(RuntimeError):
    """A Ray set-up that cannot work: the message (one line) names the config keys and the numbers."""


def import_ray():
    """Ray, imported when first needed (``ctu`` imports without it), with its usage report off."""
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")  # no usage report leaves the machine
    try:
        import ray
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise ImportError("Ray rollout workers need ray: pip install 'ctu[distributed]'") from exc
    return ray


def address_endpoint(address: str | None) -> tuple[str, int] | None:
    """``(host, port)`` of an explicit address (``host:port``, ``ray://host:port``, ``[v6]:port``); None for
    ``None``/``auto``/``local`` (Ray resolves those itself). A malformed address raises :class:`RaySetupError`."""
    if address is None or address in ("auto", "local"):
        return None
    rest = address.split("://", 1)[1] if "://" in address else address
    host, sep, port = rest.rpartition(":")
    if not sep:
        host, port = rest, ("10001" if address.startswith("ray://") else "6379")  # Ray's default ports
    host = host.strip("[]")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise RaySetupError(f"distributed.address={address}: not host:port (or auto)")
    return host, int(port)


def probe_address(address: str | None, timeout_s: float = CONNECT_TIMEOUT_S) -> None:
    """Raise :class:`RaySetupError` naming ``address`` when nothing accepts a TCP connection there in time."""
    endpoint = address_endpoint(address)
    if endpoint is None:
        return
    host, port = endpoint
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return
    except TimeoutError:
        why = f"no answer within {timeout_s:g} s"
    except OSError as exc:
        why = exc.strerror or type(exc).__name__
    raise RaySetupError(f"distributed.address={address}: no Ray cluster reachable at {host}:{port} ({why}); "
                        "start one there (ray start --head) or fix the address")


def start_ray(ray, address: str | None) -> bool:
    """``ray.init`` unless Ray is initialised (False); a local cluster names 127.0.0.1 as its node's address and has
    token authentication on (``RAY_AUTH_MODE=token`` unless set), an address is probed first and a failure to join
    it names it."""
    if ray.is_initialized():
        return False
    probe_address(address)
    if not address:  # Ray 2.60's gcs_server, raylet and workers listen on every interface: its token guards them
        os.environ.setdefault("RAY_AUTH_MODE", "token")  # (Ray >= 2.52; ray.init makes the token)
    try:
        ray.init(address=address, include_dashboard=False,
                 **({} if address else {"_node_ip_address": "127.0.0.1"}))
    except (ConnectionError, RuntimeError, ValueError, TimeoutError) as exc:
        if not address:
            raise
        raise RaySetupError(f"distributed.address={address}: could not join the Ray cluster: {first_line(exc)}") \
            from exc
    return True


def rendezvous_endpoint(address: str | None) -> str:
    """``tcp://host:port`` where the trainer ranks meet: a free port of 127.0.0.1 on a local cluster; of this node's
    address where ``address`` (``distributed.address``) joins a cluster, whose other machines must reach it."""
    host = "127.0.0.1"
    if address:
        import ray

        host = ray.util.get_node_ip_address() or host
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        s.bind((host, 0))
        return f"tcp://{host}:{s.getsockname()[1]}"


def rendezvous_store(init_method: str, rank: int, world: int) -> Any:
    """The rendezvous store at ``tcp://host:port``. Rank 0 serves it on a socket bound to ``host`` alone (torch's
    own ``tcp://`` rendezvous listens on every interface); the other ranks connect to it."""
    from datetime import timedelta

    import torch.distributed as dist

    host, _, port = init_method.removeprefix("tcp://").rpartition(":")
    host = host.strip("[]")
    timeout = timedelta(minutes=30)  # torch's default process-group timeout
    if rank != 0:
        return dist.TCPStore(host, int(port), world, is_master=False, timeout=timeout)
    listener = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    try:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((host, int(port)))
        listener.listen(max(128, world))
    except OSError:
        listener.close()
        raise
    return dist.TCPStore(host, int(port), world, is_master=True, timeout=timeout, master_listen_fd=listener.detach())


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


_RAISED = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt|Warning)\b(:.*)?$")


def raised_line(exc: BaseException) -> str:
    """The line a Ray error's traceback ends with (``OSError: ...``: what the actor raised), else its first line."""
    cause = getattr(exc, "cause", None)
    if isinstance(cause, BaseException) and not hasattr(cause, "traceback_str"):
        return f"{type(cause).__name__}: {first_line(cause)}"
    raised = [line.strip() for line in str(exc).splitlines() if _RAISED.match(line)]
    return raised[-1] if raised else first_line(exc)


def _fmt(value: float) -> str:
    return f"{value:g}"


def room_problem(bundles: Sequence[Mapping[str, float]], total: Mapping[str, float],
                 largest_node: Mapping[str, float] | None, what: str, where: str = "the Ray cluster") -> str | None:
    """Why ``bundles`` (each a set of resources that must sit on one node) cannot fit, or None.

    ``total``: the cluster's resources; ``largest_node``: the most of each resource one node has (None: one node,
    so ``total``). ``what`` names the keys behind the bundles, ``where`` the capacity."""
    for name in RESOURCES:
        need = sum(b.get(name, 0.0) for b in bundles)
        have = total.get(name, 0.0)
        if need > have + 1e-9:
            return f"{what} need {_fmt(need)} {name}s; {where} has {_fmt(have)}"
    if largest_node is not None:
        for name in RESOURCES:
            biggest = max((b.get(name, 0.0) for b in bundles), default=0.0)
            have = largest_node.get(name, 0.0)
            if biggest > have + 1e-9:
                return (f"{what} need {_fmt(biggest)} {name}s on one node; the largest node of {where} has "
                        f"{_fmt(have)}")
    return None


def cluster_room(ray) -> tuple[dict[str, float], dict[str, float] | None]:
    """The cluster's total resources and the most of each that one alive node has (None: no node listed)."""
    total = {k: float(v) for k, v in ray.cluster_resources().items() if k in RESOURCES}
    largest: dict[str, float] = {}
    for node in ray.nodes():
        if not node.get("Alive", True):
            continue
        for k in RESOURCES:
            largest[k] = max(largest.get(k, 0.0), float((node.get("Resources") or {}).get(k, 0.0)))
    return total, largest or None


def local_room() -> dict[str, float]:
    """What a local Ray cluster started here would have: Ray's CPU count (cgroup-aware) and the visible GPUs."""
    try:
        from ray._private.utils import get_num_cpus

        cpus = float(get_num_cpus())
    except Exception:  # noqa: BLE001 - a private helper: fall back to the OS's count
        cpus = float(len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)
    try:
        import torch

        gpus = float(torch.cuda.device_count()) if torch.cuda.is_available() else 0.0
    except Exception:  # noqa: BLE001 - no usable CUDA
        gpus = 0.0
    return {"CPU": cpus, "GPU": gpus}


def check_room(ray, bundles: Sequence[Mapping[str, float]], what: str) -> None:
    """Raise :class:`RaySetupError` when ``bundles`` cannot fit: on the cluster once Ray is initialised, else on
    this machine (where a local cluster would start)."""
    if ray.is_initialized():
        total, largest = cluster_room(ray)
        problem = room_problem(bundles, total, largest, what)
    else:
        problem = room_problem(bundles, local_room(), None, what, where="this machine (a local Ray cluster)")
    if problem:
        raise RaySetupError(problem)


def pool_demand(workers: int, cpus: float, gpus: float = 0.0) -> tuple[list[dict[str, float]], str]:
    """Rollout workers outside a placement group: one bundle each, and the keys behind them."""
    what = (f"distributed.rollout_workers={workers} with distributed.worker_cpus={cpus:g}"
            + (f" and {gpus:g} GPUs" if gpus else "") + " each")
    return [{"CPU": float(cpus), "GPU": float(gpus)}] * workers, what


def placement_bundles(trainers: int, workers: int, placement: str, trainer_cpus: float, worker_cpus: float,
                      gpu: float) -> tuple[list[dict[str, float]], dict[str, Any] | None]:
    """The placement group's bundles and where rollout workers go (None: no rollout workers).

    ``colocated``: one bundle per trainer rank; rollout worker k shares bundle k % trainers (and its GPU, split
    evenly between the rank and its workers). ``split``: trainer bundles, then one bundle per rollout worker."""
    if placement not in ("colocated", "split"):
        raise ValueError(f"distributed.placement: must be colocated or split, got {placement!r}")
    if placement == "split":
        bundles = [_bundle(trainer_cpus, gpu) for _ in range(trainers)]
        bundles += [_bundle(worker_cpus, gpu) for _ in range(workers)]
        where = {"bundles": list(range(trainers, trainers + workers)), "worker_gpu": gpu, "trainer_gpu": gpu}
        return bundles, where if workers else None
    per_bundle = [1 + sum(1 for w in range(workers) if w % trainers == k) for k in range(trainers)]
    bundles = [_bundle(trainer_cpus + (n - 1) * worker_cpus, gpu) for n in per_bundle]
    share = gpu / max(per_bundle) if gpu else 0.0
    where = {"bundles": [w % trainers for w in range(workers)], "worker_gpu": share, "trainer_gpu": share}
    return bundles, where if workers else None


def _bundle(cpus: float, gpu: float) -> dict[str, float]:
    return {"CPU": cpus, **({"GPU": gpu} if gpu else {})}


def group_demand(d, gpu: float) -> tuple[list[dict[str, float]], str]:
    """The trainer group's placement bundles (``d``: ``config.distributed``; ``gpu``: per trainer rank), and the
    keys behind them."""
    bundles, _ = placement_bundles(d.trainer_workers, d.rollout_workers, d.placement, d.trainer_cpus,
                                   d.worker_cpus, gpu)
    what = (f"distributed.trainer_workers={d.trainer_workers} (distributed.trainer_cpus={d.trainer_cpus:g} each) "
            f"and distributed.rollout_workers={d.rollout_workers} (distributed.worker_cpus={d.worker_cpus:g} each), "
            f"distributed.placement={d.placement},")
    return bundles, what


def preflight(config) -> None:
    """What can be checked before anything is loaded: an explicit ``distributed.address`` answers, and the actors
    fit the cluster (when Ray is up) or this machine (a local cluster to start). No-op without Ray actors."""
    d = config.distributed
    if not (d.rollout_workers or d.trainer_workers):
        return
    ray = import_ray()
    if not ray.is_initialized() and d.address:
        probe_address(d.address)
        return
    if d.trainer_workers:
        have = ray.cluster_resources().get("GPU", 0) if ray.is_initialized() else local_room()["GPU"]
        bundles, what = group_demand(d, 1.0 if have >= 1 else 0.0)
    else:
        bundles, what = pool_demand(d.rollout_workers, d.worker_cpus)
    check_room(ray, bundles, what)


def wait_started(ray, refs: Sequence, names: Sequence[str], timeout_s: float,
                 key: str = "distributed.start_timeout_s") -> list:
    """``ray.get`` of actor start-up calls, bounded by ``timeout_s`` in all; the first failure, or the actors
    still starting at the deadline, in one line (:class:`RaySetupError`)."""
    from ray.exceptions import RayError

    deadline = time.monotonic() + timeout_s
    pending = dict(zip(refs, names, strict=True))
    while pending:
        done, _ = ray.wait(list(pending), num_returns=1, timeout=max(0.0, deadline - time.monotonic()))
        if not done:
            waiting = list(pending.values())
            shown = ", ".join(waiting[:4]) + (f" (+{len(waiting) - 4} more)" if len(waiting) > 4 else "")
            raise RaySetupError(f"{shown} did not start within {key}={_fmt(timeout_s)} s (the cluster may lack "
                                f"free resources: ray status shows them)")
        name = pending.pop(done[0])
        try:
            ray.get(done[0])
        except RayError as exc:
            raise RaySetupError(f"{name} failed to start: {raised_line(exc)}") from exc
    return ray.get(list(refs))
