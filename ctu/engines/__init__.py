"""Inference engines behind one interface: hf (in-process transformers), remote (OpenAI-compatible), vllm."""
