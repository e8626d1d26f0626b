"""The policy and its update: model building (LoRA or full), logprobs, the GRPO/PPO step, warm-start demos, judge
shaping, checkpoints, and the weight sync into the rollout engine."""
