"""Task sampling that keeps up with the policy.

The trainer owns a `Curriculum`. After collecting each step it shows it the
groups it read (`GroupOutcome`: every sample's reward, before zero-advantage
groups are dropped), and the curriculum answers with the `SamplerState` of
the next step. The state is small and public: it travels with the assignment
(protocol/sampler.py; the orchestrator records it per step and hands it to
validators with each file's assignment), and fixes, together with the assignment seed, every
prompt of a file. A worker cannot pick its own difficulty: a validator
recomputes the prompts from the state the trainer issued for the file's step.

Two kinds of task source, two mechanisms:

- Generated tasks have a difficulty knob (tasks/sources/generated.py: one more
  character to reverse, one more digit per operand, per level). One level is
  in force per step. Decisions look at the last `window_groups` groups of the
  current level read since the last change: the level goes up when their mean
  reward reaches `up_reward`, or when fewer than `min_signal` of them carry
  signal and most of those without signal were solved by every sample; it goes
  down when their mean reward falls to `down_reward`, or when signal is rare
  and most groups failed every sample. Each change empties the window, so
  groups still arriving from the old level (asynchrony) never decide the new
  one.
- File datasets keep per-problem outcomes: a problem whose last
  `history_groups` groups were all solved by every sample (or all failed by
  every sample) is drawn with weight `mastered_weight` instead of 1 (never 0:
  nothing is starved), until a group of it carries signal again. Drawing is
  rejection sampling over hashed candidates, so it is a pure function of
  (assignment seed, state) and a validator reproduces it.

"Solved" means task reward ≥ 1 − 1e-6 for every sample; "failed", ≤ 1e-6.
Both are judged on the task reward (the verifier's), not on the length-shaped
reward.

The state is part of the trainer's checkpoint (`Curriculum.to_dict`), so a
resumed run continues the same curriculum.
"""

from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass

from swarmrl.config import CurriculumConfig
from swarmrl.protocol.sampler import SamplerState

log = logging.getLogger("swarmrl.curriculum")

SOLVED, FAILED = 1.0 - 1e-6, 1e-6


@dataclass
class GroupOutcome:
    """One prompt group as the trainer read it."""

    step: int  # the step the file was assigned for (its sampler state)
    problem_id: str
    rewards: list[float]
    task_rewards: list[float]

    @property
    def solved(self) -> bool:
        return min(self.task_rewards) >= SOLVED

    @property
    def failed(self) -> bool:
        return max(self.task_rewards) <= FAILED

    @property
    def signal(self) -> bool:
        return max(self.rewards) - min(self.rewards) > 1e-9


class Curriculum:
    """The trainer's side: outcomes in, the next step's SamplerState out.

    `problem_index`: for a file dataset, problem id → record indices (None for
    generated tasks); `max_level`: the highest level the knob may reach."""

    def __init__(
        self, cfg: CurriculumConfig, max_level: int, problem_index: dict[str, list[int]] | None
    ):
        self.cfg = cfg
        self.max_level = max_level
        self.problem_index = problem_index
        self.level = min(cfg.start_level, max_level)
        self.issued: dict[int, int] = {}  # step -> level issued for it (recent steps)
        self.window: deque[tuple[float, bool, bool, bool]] = deque(maxlen=cfg.window_groups)
        self.history: dict[str, list[str]] = {}  # problem id -> last outcomes ('s', 'f', 'm')
        self.weights: dict[int, float] = {}
        self.changes: list[dict] = []  # (step, from, to, why), for the log and metrics

    # -- what the trainer publishes -------------------------------------------------
    def state(self) -> SamplerState:
        if not self.cfg.enabled:
            return SamplerState(level=self.cfg.start_level)
        return SamplerState(level=self.level, weights=dict(self.weights))

    def issue(self, step: int) -> SamplerState:
        """The state in force for `step`; remembered to attribute its groups later."""
        s = self.state()
        self.issued[step] = s.level
        for old in [k for k in self.issued if k < step - 64]:
            del self.issued[old]
        return s

    # -- what the trainer reads ------------------------------------------------------
    def observe(self, step: int, outcomes: list[GroupOutcome]) -> None:
        """Take the groups read while collecting `step`; may change the level."""
        if not self.cfg.enabled:
            return
        if self.problem_index is not None:
            self._observe_problems(outcomes)
            return
        for o in outcomes:
            if self.issued.get(o.step, -1) != self.level:
                continue  # an older level's group (asynchrony): not evidence about this one
            mean = sum(o.rewards) / len(o.rewards)
            self.window.append((mean, o.signal, o.solved, o.failed))
        if len(self.window) < self.cfg.window_groups:
            return
        n = len(self.window)
        reward = sum(w[0] for w in self.window) / n
        signal = sum(w[1] for w in self.window) / n
        solved = sum(w[2] for w in self.window)
        failed = sum(w[3] for w in self.window)
        rare = signal < self.cfg.min_signal
        if self.level < self.max_level and (
            reward >= self.cfg.up_reward or (rare and solved >= failed)
        ):
            why = f"reward {reward:.3f}" if reward >= self.cfg.up_reward else "mastered"
            self._change(step, self.level + 1, f"{why}, signal {signal:.2f}")
        elif self.level > 0 and (reward <= self.cfg.down_reward or (rare and failed > solved)):
            why = f"reward {reward:.3f}" if reward <= self.cfg.down_reward else "too hard"
            self._change(step, self.level - 1, f"{why}, signal {signal:.2f}")

    def _change(self, step: int, level: int, why: str) -> None:
        log.info("step %d: difficulty level %d -> %d (%s)", step, self.level, level, why)
        self.changes.append({"step": step, "from": self.level, "to": level, "why": why})
        self.level = level
        self.window.clear()

    def _observe_problems(self, outcomes: list[GroupOutcome]) -> None:
        k = self.cfg.history_groups
        for o in outcomes:
            indices = self.problem_index.get(o.problem_id)
            if not indices:
                continue
            mark = "s" if o.solved else "f" if o.failed else "m"
            h = self.history.setdefault(o.problem_id, [])
            h.append(mark)
            del h[:-k]
            down = len(h) == k and (set(h) == {"s"} or set(h) == {"f"})
            for i in indices:
                if down:
                    self.weights[i] = self.cfg.mastered_weight
                else:
                    self.weights.pop(i, None)

    # -- checkpoint -------------------------------------------------------------------
    def to_dict(self) -> dict:
        return {
            "level": self.level,
            "issued": dict(self.issued),
            "window": list(self.window),
            "history": self.history,
            "weights": dict(self.weights),
            "changes": self.changes,
        }

    def load_dict(self, d: dict) -> None:
        self.level = min(int(d["level"]), self.max_level)
        self.issued = {int(k): int(v) for k, v in d["issued"].items()}
        self.window.clear()
        self.window.extend(tuple(w) for w in d["window"])
        self.history = {k: list(v) for k, v in d["history"].items()}
        self.weights = {int(k): float(v) for k, v in d["weights"].items()}
        self.changes = list(d["changes"])


def run_curriculum(cfg, source) -> Curriculum:
    """The curriculum of a run (`cfg`: RunConfig) over its task source."""
    from swarmrl.tasks.sources.generated import max_level

    index = source.problem_index()
    if index is not None:
        top = 0  # file datasets have no difficulty knob; their problems are weighted
    elif cfg.curriculum.max_level >= 0:
        top = cfg.curriculum.max_level
    else:
        top = max(cfg.curriculum.start_level, max_level(cfg.task, cfg.sampling.max_new_tokens))
    return Curriculum(cfg.curriculum, top, index)
