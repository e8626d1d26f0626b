"""RL math as small pure functions: advantages, losses, filters."""
