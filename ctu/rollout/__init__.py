"""Episodes played by a model, token-in-token-out: chat templates, the agent loop, and the running
parts (engine, chat format, users, judge) built from a config."""
