"""The task sampler that keeps up with the policy: levels, per-problem weights, state."""

from __future__ import annotations

import json
from collections import Counter

import pytest
import torch

from swarmrl.config import CurriculumConfig, TaskConfig, load_config
from swarmrl.models.tiny import build_char_tokenizer
from swarmrl.protocol.prompts import assigned_prompts
from swarmrl.protocol.sampler import SamplerState, SamplerStateError, draw_indices
from swarmrl.tasks.curriculum import Curriculum, GroupOutcome, run_curriculum
from swarmrl.tasks.sources.generated import max_level, reverse_text
from swarmrl.tasks.sources.task_source import TaskSource


def _groups(step: int, rewards: list[list[float]], pid: str = "p") -> list[GroupOutcome]:
    return [GroupOutcome(step, pid, r, r) for r in rewards]


SOLVED = [1.0] * 8
MIXED = [1.0, 0.5, 0.8, 1.0, 0.2, 0.6, 1.0, 0.9]  # mean 0.75, with signal
HALF = [1.0, 0.0] * 4  # mean 0.5, with signal
FAILED = [0.0] * 8


def test_level_moves_up_on_reward_and_resets_its_window():
    c = Curriculum(
        CurriculumConfig(window_groups=4, up_reward=0.7), max_level=5, problem_index=None
    )
    assert c.issue(1).level == 0
    c.observe(1, _groups(1, [HALF] * 3))
    assert c.level == 0  # window not full yet
    c.observe(1, _groups(1, [MIXED] * 4))  # window: the last 4 groups, mean 0.75
    assert c.level == 1 and not c.window
    # groups of the old level still arriving (asynchrony) are not evidence about level 1
    assert c.issue(2).level == 1
    c.observe(2, _groups(1, [SOLVED] * 10))
    assert c.level == 1 and not c.window
    c.observe(2, _groups(2, [HALF] * 4))
    assert c.level == 1  # 0.5: between the thresholds
    assert c.changes[0]["from"] == 0 and c.changes[0]["to"] == 1


def test_rare_signal_moves_the_level_toward_where_signal_is():
    cfg = CurriculumConfig(window_groups=4, up_reward=0.99, down_reward=0.01, min_signal=0.5)
    c = Curriculum(cfg, max_level=3, problem_index=None)
    c.issue(1)
    # 3 of 4 solved by every sample, 1 with signal: mastered, though the mean is below up_reward
    c.observe(1, _groups(1, [SOLVED, SOLVED, SOLVED, HALF]))
    assert c.level == 1
    c.issue(2)
    c.observe(2, _groups(2, [FAILED, FAILED, FAILED, HALF]))  # too hard: back down
    assert c.level == 0
    c.issue(3)
    c.observe(3, _groups(3, [FAILED] * 4))
    assert c.level == 0  # never below 0


def test_level_stops_at_max_level_and_disabled_curriculum_never_moves():
    c = Curriculum(CurriculumConfig(window_groups=2), max_level=1, problem_index=None)
    for step in range(1, 6):
        c.issue(step)
        c.observe(step, _groups(step, [SOLVED] * 2))
    assert c.level == 1
    off = Curriculum(
        CurriculumConfig(enabled=False, start_level=2, window_groups=2), 5, problem_index=None
    )
    for step in range(1, 6):
        assert off.issue(step).level == 2
        off.observe(step, _groups(step, [SOLVED] * 2))
    assert off.state() == SamplerState(level=2)


def test_levels_make_problems_longer_and_name_their_level():
    cfg = TaskConfig(min_len=3, max_len=6)
    lengths = {lv: {len(reverse_text(cfg, "train", i, 0, lv).metadata["text"]) for i in range(200)}
               for lv in (0, 2)}  # fmt: skip
    assert lengths[0] == {3, 4, 5, 6} and lengths[2] == {5, 6, 7, 8}
    assert reverse_text(cfg, "train", 7, 0, 2).problem_id == "reverse_text/train/L2/7"
    assert reverse_text(cfg, "train", 7, 0).problem_id == "reverse_text/train/7"
    # the longest answer + EOS fits the completion limit at the top level
    assert max_level(cfg, 12) == 5 and cfg.max_len + max_level(cfg, 12) + 1 == 12


def test_mastered_problems_are_drawn_less_but_never_starved():
    n = 20
    mastered = set(range(10))
    state = SamplerState(weights={i: 0.1 for i in mastered})
    counts = Counter()
    for seed in range(400):
        counts.update(draw_indices(seed, 8, state, n))
    per_mastered = sum(counts[i] for i in mastered) / len(mastered)
    per_other = sum(counts[i] for i in range(10, n)) / 10
    assert 0.05 < per_mastered / per_other < 0.2  # weight 0.1, within sampling noise
    assert all(counts[i] > 0 for i in mastered)  # the floor holds
    # a pure function of (seed, state): a validator draws the same indices
    assert draw_indices(123, 8, state, n) == draw_indices(123, 8, state, n)


def test_file_datasets_down_weight_problems_solved_or_failed_every_time():
    cfg = CurriculumConfig(history_groups=2, mastered_weight=0.2)
    index = {"a": [0], "b": [1, 5], "c": [2]}
    c = Curriculum(cfg, max_level=0, problem_index=index)
    c.issue(1)
    c.observe(1, _groups(1, [SOLVED], "a") + _groups(1, [FAILED], "b") + _groups(1, [HALF], "c"))
    assert c.state().weights == {}  # one group is not yet a history of k
    c.observe(2, _groups(2, [SOLVED], "a") + _groups(2, [FAILED], "b") + _groups(2, [HALF], "c"))
    assert c.state().weights == {0: 0.2, 1: 0.2, 5: 0.2}
    c.observe(3, _groups(3, [HALF], "a"))  # signal again: back to full weight
    assert c.state().weights == {1: 0.2, 5: 0.2}
    c.observe(3, _groups(3, [SOLVED], "zzz"))  # unknown problem ids are ignored
    assert c.state().level == 0


def test_state_round_trips_through_a_checkpoint(tmp_path):
    cfg = CurriculumConfig(window_groups=4)
    c = Curriculum(cfg, max_level=5, problem_index=None)
    c.issue(1)
    c.observe(1, _groups(1, [MIXED] * 4))
    c.issue(2)
    c.observe(2, _groups(2, [HALF] * 3))
    torch.save({"curriculum": c.to_dict()}, tmp_path / "state.pt")
    resumed = Curriculum(cfg, max_level=5, problem_index=None)
    resumed.load_dict(torch.load(tmp_path / "state.pt", weights_only=False)["curriculum"])
    assert resumed.to_dict() == c.to_dict() and resumed.state() == c.state()
    for cur in (c, resumed):  # the same groups lead both to the same decisions
        cur.observe(2, _groups(2, [MIXED]))
        assert cur.level == 1  # the window (3 x 0.5 + 0.75) / 4 is below up_reward
        cur.observe(2, _groups(2, [SOLVED] * 3))
    assert resumed.level == c.level == 2 and resumed.to_dict() == c.to_dict()


def test_sampler_state_json_is_validated(tmp_path):
    s = SamplerState(level=3, weights={4: 0.25})
    assert SamplerState.from_json(json.loads(json.dumps(s.to_json()))) == s
    for bad in (
        [],
        {"level": -1},
        {"level": "2"},
        {"level": 1, "weights": {"x": 0.5}},
        {"level": 1, "weights": {"3": 0.0}},
        {"level": 1, "weights": {"3": 1.5}},
        {"level": 1, "other": 1},
    ):
        with pytest.raises(SamplerStateError):
            SamplerState.from_json(bad)


def test_worker_and_validator_recompute_the_same_prompts_from_the_assignment(tmp_path):
    """Prompts are a function of (assignment seed, issued state) only: the worker's plan
    and a validator's plan agree, and another level gives other prompts."""
    cfg = load_config(None, ["worker.groups_per_file=6"])
    tok = build_char_tokenizer()
    source = TaskSource(cfg.task, cfg.seed)
    issued = json.loads(json.dumps(SamplerState(level=2).to_json()))  # as it travels
    worker = assigned_prompts(cfg, source, tok, 4242, SamplerState(level=2))
    validator = assigned_prompts(
        cfg, TaskSource(cfg.task, cfg.seed), tok, 4242, SamplerState.from_json(issued)
    )
    assert [p.tokens for p in worker] == [p.tokens for p in validator]
    assert all("/L2/" in p.task.problem_id for p in worker)
    easy = assigned_prompts(cfg, source, tok, 4242, SamplerState())
    assert [p.tokens for p in easy] != [p.tokens for p in worker]


def test_run_curriculum_caps_levels_by_the_completion_limit(tmp_path):
    cfg = load_config(None, ["sampling.max_new_tokens=12", "task.max_len=6"])
    assert run_curriculum(cfg, TaskSource(cfg.task, cfg.seed)).max_level == 5
    cfg = load_config(None, ["curriculum.max_level=2"])
    assert run_curriculum(cfg, TaskSource(cfg.task, cfg.seed)).max_level == 2
    data = tmp_path / "tasks.jsonl"
    data.write_text(
        "\n".join(
            json.dumps(
                {
                    "problem_id": f"q{i}",
                    "prompt": f"Reverse the text: ab{i}",
                    "task_type": "reverse_text",
                    "verification_info": {"answer": f"{i}ba"},
                }
            )
            for i in range(3)
        )  # fmt: skip
    )
    cfg = load_config(None, [f"task.dataset={json.dumps(str(data))}"])
    c = run_curriculum(cfg, TaskSource(cfg.task, cfg.seed))
    assert c.max_level == 0 and c.problem_index == {"q0": [0], "q1": [1], "q2": [2]}
