"""Adapters for the RL trainers users already run, scoring ctu's parquet tasks with ctu's environments.

- :mod:`ctu.app.integrations.verl_reward`: verl's custom reward function (``compute_score``), for rows whose
  ``data_source`` is ``ctu/<domain>`` (other data sources go to verl's own ``default_compute_score``);
- :mod:`ctu.app.integrations.skyrl_env`: a SkyRL (``skyrl_gym``) text environment per domain, ``ctu_<domain>``,
  playing the task against ctu's scripted user and scoring it with ctu's tau2 reward.

Neither imports verl or SkyRL at import time: ctu works without them.
"""
