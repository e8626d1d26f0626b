"""``trainer.branch_k``: the synchronous loop asks for branched rollouts and puts each fork's siblings in the
group of the task they were forked from."""

from types import SimpleNamespace

from ctu.app.sync_loop import TrainingRewards, collect_now
from ctu.app.task_sampler import TaskSampler
from ctu.config.schema import load_config
from ctu.domains.mini import load

MINI = load()


def test_siblings_join_the_group_of_their_spec():
    config = load_config("configs/quickstart.yaml", ["trainer.tasks_per_step=3", "trainer.branch_k=3"])
    asked = []

    def rollout(specs, temperature, seed, branch=None):
        asked.append(branch)
        out = []
        for n, s in enumerate(specs):  # the first spec ends before any tool result: no fork
            forks = [None] if n == 0 else [(j, 7) for j in range(branch.k)]
            out += [SimpleNamespace(domain=s.domain.name, task_id=s.task.id, stop_reason="user_stop", reward=1.0,
                                    fork=f) for f in forks]
        return out

    trainer = SimpleNamespace(config=config, step=1, sampler=TaskSampler([MINI], [1.0], seed=0), _rollout=rollout,
                              rewards=lambda batch: TrainingRewards(*(tuple(tr.reward for tr in batch),) * 2))
    trajectories, groups, _, chosen, _ = collect_now(trainer)
    assert [b.k for b in asked] == [3] and len(trajectories) == 7
    assert len(set(groups)) == 3 and groups[1:4] == [groups[1]] * 3 and groups[4:] == [groups[4]] * 3
    assert [tr.task_id for tr in trajectories[1:4]] == [trajectories[1].task_id] * 3
