"""Weight fingerprints: an outside check that an engine serves the weights the trainer sent.

The version stamp says that a load was *called*; an engine that acknowledged a load and kept its old weights
still carries the new stamp. A fingerprint is computed by the engine from the tensors it holds, and by the
trainer from the tensors it sent, and the two must agree: ``(count, sum, sum of squares)`` of every value, in
float64, after casting to the engine's dtype. Sums do not depend on how an engine lays the weights out: vLLM's
fused projections (q/k/v, gate/up) are concatenations, its vocabulary padding holds zeros, and a tied lm_head is
one tensor, so they leave the three numbers as the Hugging Face tensors give them (a padded vocabulary adds
zeros: an engine may hold more values, never fewer). An engine whose parameters show fewer values than were sent
hides some weights (vLLM's CPU kernels keep linear weights packed outside their parameters): its fingerprint is
not compared, and the load is checked by version and parity alone. Two loads of different values differ in the sum of squares
unless their changes cancel to the last float64 bit; float64 summation order moves it by ~1e-16 relative.

Where an engine computes it: :class:`~ctu.engines.hf.engine.HFEngine` over its model; vLLM (in process and served)
through :class:`FingerprintExtension`, a worker extension (``worker_extension_cls``) whose ``ctu_fingerprint``
runs in every worker (``collective_rpc``; a server needs its dev routes for that).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

EXTENSION = "ctu.engines.checks.fingerprint.FingerprintExtension"  # vLLM's worker_extension_cls
TOLERANCE = 1e-9  # relative: float64 sums of the same values in another order agree far closer


@dataclass(frozen=True)
class Fingerprint:
    count: int
    total: float
    squares: float
    dtype: str = "float32"

    def as_list(self) -> list:
        return [self.count, self.total, self.squares, self.dtype]

    @classmethod
    def of(cls, value) -> Fingerprint | None:
        """From :meth:`as_list` (a worker's answer), a Fingerprint, or None (unknown)."""
        if value is None or isinstance(value, Fingerprint):
            return value
        count, total, squares, dtype = value
        return cls(int(count), float(total), float(squares), str(dtype))


def matches(a: Fingerprint, b: Fingerprint, tolerance: float = TOLERANCE) -> bool:
    """Whether two fingerprints are of the same values (sums within ``tolerance``, relative)."""
    def close(x: float, y: float) -> bool:
        return abs(x - y) <= tolerance * max(abs(x), abs(y), 1e-30)
    return close(a.total, b.total) and close(a.squares, b.squares)


class Accumulator:
    """The trainer's side: fingerprints a weight stream as it flows to the engines (in every dtype an engine may
    hold), holding no tensor."""

    def __init__(self, dtypes: Sequence[str] = ("float32", "bfloat16")):
        self.sums = {d: [0, 0.0, 0.0] for d in dtypes}

    def add(self, tensor) -> None:
        import torch

        for dtype, acc in self.sums.items():
            for k, value in enumerate(tensor_sums(torch.as_tensor(tensor), getattr(torch, dtype))):
                acc[k] += value

    def stream(self, named_tensors: Iterable[tuple[str, object]]) -> Iterator[tuple[str, object]]:
        for name, tensor in named_tensors:
            self.add(tensor)
            yield name, tensor

    def fingerprint(self, dtype: str) -> Fingerprint | None:
        acc = self.sums.get(dtype)
        return None if acc is None else Fingerprint(int(acc[0]), acc[1], acc[2], dtype)


CHUNK = 1 << 22  # values cast to float64 at once: a bounded temporary, whatever the tensor (an embedding: ~10^9)


def tensor_sums(tensor, dtype=None) -> tuple[int, float, float]:
    """(count, sum, sum of squares) of ``tensor``'s values, cast to ``dtype`` first (None: as they are), in float64,
    a chunk at a time."""
    import torch

    count, total, squares = 0, 0.0, 0.0
    with torch.no_grad():
        for chunk in tensor.detach().reshape(-1).split(CHUNK):
            values = (chunk if dtype is None else chunk.to(dtype)).double()
            count, total, squares = count + values.numel(), total + float(values.sum()), squares + float(values.pow(2).sum())
    return count, total, squares


def of_module(module) -> Fingerprint:
    """A model's fingerprint from its own parameters (dtype: that of its first parameter)."""
    count, total, squares, dtype = 0, 0.0, 0.0, "float32"
    for i, (_, p) in enumerate(module.named_parameters()):
        if i == 0:
            dtype = str(p.dtype).removeprefix("torch.")
        n, t, q = tensor_sums(p)
        count, total, squares = count + n, total + t, squares + q
    return Fingerprint(count, total, squares, dtype)


def hidden(held: Fingerprint, want: Fingerprint) -> bool:
    """Whether the engine's parameters hide some of the weights it computes with: fewer values than were sent
    (vLLM's CPU kernels repack every linear weight into an opaque oneDNN handle and leave an empty parameter).
    Its fingerprint then says nothing about the load."""
    return held.count < want.count


def mismatch(engines: Sequence[Fingerprint | None], sent: Accumulator | None, version: int) -> str | None:
    """Why the engines' fingerprints are not the trainer's (one line), or None: all agree or cannot be told."""
    if sent is None:
        return None
    for k, held in enumerate(engines):
        if held is None:
            continue
        want = sent.fingerprint(held.dtype)
        if want is not None and not hidden(held, want) and not matches(held, want):
            return (f"engine {k} acknowledged the weights of version {version} but holds other ones: fingerprint "
                    f"(sum {held.total:.9g}, sum of squares {held.squares:.9g}, {held.dtype}) against the trainer's "
                    f"(sum {want.total:.9g}, sum of squares {want.squares:.9g}); it did not load what was sent")
    return None


class FingerprintExtension:
    """vLLM worker extension (``worker_extension_cls``): ``collective_rpc("ctu_fingerprint")`` returns the
    fingerprint of the model this worker runs, as a list (JSON over a server's ``/collective_rpc``)."""

    def ctu_fingerprint(self) -> list:
        runner = self.model_runner  # type: ignore[attr-defined]  # the vLLM worker this class extends
        model = runner.get_model() if hasattr(runner, "get_model") else runner.model
        return of_module(model).as_list()
