"""Datasets in and out: conversations (gold demonstrations, successful eval trajectories) as OpenAI chat JSONL
or LLaMA-Factory sharegpt, and tasks as the parquet prompt layout verl and SkyRL read (``ctu data``)."""
