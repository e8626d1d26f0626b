"""ctu: teach language models multi-turn tool use with reinforcement learning."""

__version__ = "0.1.0"
