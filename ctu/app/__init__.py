"""The commands on top of the flow: the CLI, the training loop, evaluation, play, memory plan,
data commands, and the adapters for other trainers."""
