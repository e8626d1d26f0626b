"""Inference engines behind one interface (base.Engine, made by registry): hf/ (in-process transformers), vllm/
(vLLM in process, a vLLM server ctu trains through, any OpenAI-compatible server), cpu/ (CPU policy), checks/.

Parts, bottom to top: base < cpu < checks < hf < vllm < registry (tests/unit/test_layout.py)."""
