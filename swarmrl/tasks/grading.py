"""A process's grading, set up from the run config: the code sandbox's limits, the
run's own reward function (`task.reward`) and the verifiers taskset's time bounds. A
worker and a validator of one run call `configure` with the same config, so they
grade alike. It sits above `graders/registry.py` and `sources/task_source.py`
(it needs both: the reward function is probed on the run's first problems), which
import nothing of it."""

from __future__ import annotations

from swarmrl.tasks.schema import TaskError


def configure(cfg) -> None:
    """Apply the run config's verifier settings in this process (a worker and a
    validator of one run call this with the same config, so they grade alike)."""
    from swarmrl.tasks.graders.code import configure as configure_code

    configure_code(cfg.code)
    configure_reward(cfg)
    if cfg.env.kind == "verifiers":  # scoring replays the trajectory's tool calls too
        from swarmrl.tasks.sources.environments import (
            TIMEOUT_S,
            set_episode_turns,
            set_score_timeout,
        )

        set_score_timeout(TIMEOUT_S + cfg.env.max_turns * cfg.env.tool_timeout_s)
        set_episode_turns(cfg.env.max_turns)


def configure_reward(cfg) -> None:
    """Grade with the run's own reward function (`task.reward`) in this process, once
    it is imported and probed on the run's first problems, and its fingerprint is the
    one the run config pins (`task.reward_fingerprint`, when set); with none, the
    tasks' own verifiers."""
    from swarmrl.tasks.graders.custom import check_pin, load_reward, use_reward

    if not cfg.task.reward:
        use_reward(None)
        return
    from swarmrl.tasks.sources.task_source import TaskSource

    reward = load_reward(cfg.task.reward, TaskSource(cfg.task, cfg.seed))
    if cfg.task.reward_fingerprint:
        try:
            check_pin(cfg.task.reward_fingerprint, reward.fingerprint)
        except TaskError:  # no checker process left behind by a refused start
            reward.close()
            raise
    use_reward(reward)
