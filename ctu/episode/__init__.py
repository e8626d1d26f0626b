"""One conversation with tools: the environment, simulated users, reward and judge, model text parsed
into tool calls, transcripts, and datasets of conversations."""
