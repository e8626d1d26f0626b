"""Helpers the test tiers share: tiny models, toy domains, FSDP and plan helpers, a real-server launcher, CPU timing."""
