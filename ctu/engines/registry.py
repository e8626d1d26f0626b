"""Make an engine by kind: ``hf`` (in-process transformers), ``remote`` (OpenAI-compatible), ``vllm``, ``served`` (a vLLM server that takes weights)."""

from __future__ import annotations

from ctu.engines.base import Engine

KINDS = ("hf", "remote", "vllm", "served")


def make_engine(kind: str, **kwargs) -> Engine:
    if kind == "hf":
        from ctu.engines.hf.engine import HFEngine

        return HFEngine(**kwargs)
    if kind == "remote":
        from ctu.engines.vllm.remote import RemoteEngine

        return RemoteEngine(**kwargs)
    if kind == "served":
        from ctu.engines.vllm.served import ServedEngine

        return ServedEngine(**kwargs)
    if kind == "vllm":
        from ctu.engines.vllm.engine import VLLMEngine

        return VLLMEngine(**kwargs)
    raise ValueError(f"unknown engine kind '{kind}' (known: {', '.join(KINDS)})")
