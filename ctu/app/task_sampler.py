"""Which training tasks a step plays: weighted, seeded sampling across domains and task descriptions."""

from __future__ import annotations

import random
from collections.abc import Sequence


def task_weight(task, weights: dict[str, float]) -> float:
    """A training task's sampling weight under ``env.task_weights``: the product of the weights of the keys its
    description matches (``field``: the field is truthy; ``field=value``: its value, as text, is ``value``)."""
    out = 1.0
    for key, weight in weights.items():
        if task.matches(key):
            out *= weight
    return out


class TaskSampler:
    """Weighted, seeded sampling of training tasks across domains (``env.weights``) and, within a domain, by
    their description (``env.task_weights``); its state is the data cursor."""

    def __init__(self, domains, weights: Sequence[float], seed: int, task_weights: dict[str, float] | None = None):
        self.pools = [(d, d.split("train") if "train" in d.splits else list(d.tasks)) for d in domains]
        self.weights = list(weights)
        self.rng = random.Random(seed)
        task_weights = task_weights or {}
        unmatched = [k for k in task_weights
                     if not any(task_weight(t, {k: 2.0}) != 1.0 for _, tasks in self.pools for t in tasks)]
        if unmatched:
            from ctu.config.schema import ConfigError

            raise ConfigError(f"env.task_weights: {', '.join(unmatched)} matches no training task's description "
                              f"in {', '.join(d.name for d, _ in self.pools)}")
        # None: every task weighs 1, drawn as before (rng.choice), so runs without task_weights are unchanged
        self.task_weights = [[task_weight(t, task_weights) for t in tasks] if task_weights else None
                             for _, tasks in self.pools]

    def check_class_field(self, name: str | None) -> None:
        """``trainer.baseline_by``: a description field that no training task has is a config error."""
        if name is not None and not any(isinstance(t.description, dict) and name in t.description for _, tasks in self.pools for t in tasks):
            from ctu.config.schema import ConfigError

            raise ConfigError(f"trainer.baseline_by: no training task's description has '{name}' "
                              f"(in {', '.join(d.name for d, _ in self.pools)})")

    def task_class(self, domain: str, task_id: str, name: str) -> str:
        """The class a training task's baseline is taken over: its domain and the value of description field
        ``name`` (``trainer.baseline_by``)."""
        if not hasattr(self, "_by_id"):
            self._by_id = {(d.name, t.id): t for d, tasks in self.pools for t in tasks}
        task = self._by_id.get((domain, task_id))
        description = task.description if task is not None and isinstance(task.description, dict) else {}
        return f"{domain}/{description.get(name)}"

    def classes(self, trajectories, name: str | None) -> list[str] | None:
        """Each trajectory's task class under ``trainer.baseline_by`` (None when it is not set)."""
        return None if name is None else [self.task_class(tr.domain, tr.task_id, name) for tr in trajectories]

    def sample(self, n: int) -> list[tuple]:
        picks = []
        for _ in range(n):
            k = self.rng.choices(range(len(self.pools)), weights=self.weights)[0]
            domain, tasks = self.pools[k]
            within = self.task_weights[k]
            picks.append((domain, self.rng.choice(tasks) if within is None else self.rng.choices(tasks, within)[0]))
        return picks

    def pairs(self, n: int, untwinned: bool = False) -> list[tuple]:
        """``n`` contrast pairs (``trainer.contrast_pairs``): tasks drawn as :meth:`sample` draws them, among those
        with a twin (``Domain.twin_of``), each followed by its twin: ``2 * n`` (domain, task). ``untwinned``
        (``trainer.contrast_pairs_all``): drawn among all tasks, one without a twin followed by itself."""
        if not hasattr(self, "_pairs"):
            twins_of = [[d.twin_of(t) for t in tasks] for d, tasks in self.pools]  # None: the task has no twin
            bare = [d.name for (d, _), twins in zip(self.pools, twins_of, strict=True) if not any(twins)]
            if bare:
                from ctu.config.schema import ConfigError

                raise ConfigError(f"trainer.contrast_pairs: no training task of {', '.join(bare)} has a contrast twin "
                                  "(Domain.twin; mini's write requests have one)")
            # the pairs each draw picks from, and their weights (None: uniform): twinned tasks, or all
            self._pairs: dict[bool, list[tuple[list[tuple], list[float] | None]]] = {}
            for every in (False, True):
                self._pairs[every] = []
                for (_, tasks), twins, within in zip(self.pools, twins_of, self.task_weights, strict=True):
                    kept = [i for i, twin in enumerate(twins) if every or twin is not None]
                    self._pairs[every].append(([(tasks[i], twins[i] or tasks[i]) for i in kept],
                                               None if within is None else [within[i] for i in kept]))
        picks = []
        for _ in range(n):
            k = self.rng.choices(range(len(self.pools)), weights=self.weights)[0]
            pairs, within = self._pairs[untwinned][k]
            task, twin = self.rng.choice(pairs) if within is None else self.rng.choices(pairs, within)[0]
            picks += [(self.pools[k][0], task), (self.pools[k][0], twin)]
        return picks

    def state(self):
        return self.rng.getstate()

    def set_state(self, state) -> None:
        self.rng.setstate(state)
