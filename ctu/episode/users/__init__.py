"""Simulated users: scripted (deterministic), LLM (OpenAI-compatible API), human (terminal)."""
