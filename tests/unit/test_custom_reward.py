"""`task.reward = "module:function"`: the start-up probe's refusals, the pin, and a
validator that recomputes the function's rewards (tasks/graders/custom.py)."""

from __future__ import annotations

import sys
import textwrap

import pytest
from pydantic import ValidationError

from swarmrl.config import TaskConfig
from swarmrl.tasks.graders.custom import check_pin, load_reward, use_reward
from swarmrl.tasks.graders.registry import verify
from swarmrl.tasks.grading import configure_reward
from swarmrl.tasks.schema import TaskError
from swarmrl.tasks.sources.task_source import TaskSource
from tests.conftest import ROOT

EXAMPLE = ROOT / "examples" / "custom_reward"
REWARDS = """
    import math

    calls = [0]

    def raises(prompt, completion, row):
        return 1 / len(completion)

    def text(prompt, completion, row):
        return "1.0"

    def nan(prompt, completion, row):
        return math.nan

    def counter(prompt, completion, row):
        calls[0] += 1
        return calls[0] / 10

    def exact(prompt, completion, row):  # a bool is a reward: True is 1.0
        return completion.strip() == row["verification_info"]["answer"]

    def length(prompt, completion, row):
        return len(completion.strip()) / 40

    def picky(prompt, completion, row):
        if completion.startswith("boom"):
            raise ValueError("no bombs")
        return 0.5

    def hangs(prompt, completion, row):
        while True:
            pass

    def slow_where_flagged(prompt, completion, row):  # slow on a busy validator, say
        import os, time
        if os.path.exists(os.environ["SLOW_FLAG"]):
            time.sleep(30)
        return len(completion.strip()) / 40

    not_a_function = 3
"""


@pytest.fixture
def rewards_path(tmp_path, monkeypatch):
    """A module of reward functions on the path of the checker processes, and the
    example's directory; no reward left active after the test."""
    (tmp_path / "test_rewards.py").write_text(textwrap.dedent(REWARDS))
    monkeypatch.setenv("PYTHONPATH", f"{tmp_path}:{EXAMPLE}")
    yield tmp_path
    use_reward(None)


SOURCE = TaskSource(TaskConfig(name="reverse_text"), 0)


def _refused(spec: str) -> str:
    with pytest.raises(TaskError) as e:
        load_reward(spec, SOURCE)
    return str(e.value)


def test_the_example_gives_full_credit_for_the_answer_and_half_at_most_for_a_near_miss():
    sys.path.insert(0, str(EXAMPLE))
    try:
        from position_reward import score
    finally:
        sys.path.remove(str(EXAMPLE))
    row = {"verification_info": {"answer": "olleh"}}
    assert score("Reverse the text: hello", " olleh\n", row) == 1.0
    assert score("", "oxlxh", row) == 0.5 * 3 / 5
    assert score("", "ollehxxxxx", row) == 0.5 * 5 / 10  # padding does not pay
    assert score("", "", row) == 0.0 and score("", "abc", row) == 0.0


def test_a_reward_that_cannot_be_used_is_refused_at_start_saying_why(rewards_path):
    missing = _refused("no_such_reward_module:score")
    assert "cannot import module 'no_such_reward_module': ModuleNotFoundError" in missing
    assert "PYTHONPATH" in missing
    assert "has no 'nope'" in _refused("test_rewards:nope")
    assert "'not_a_function' in module 'test_rewards' is not a function (int)" in _refused(
        "test_rewards:not_a_function"
    )
    raised = _refused("test_rewards:raises")
    assert "raised ZeroDivisionError: division by zero (test_rewards.py line 7)" in raised
    assert "on problem reverse_text/train/0" in raised and "with completion ''" in raised
    assert "returned str '1.0', not a number" in _refused("test_rewards:text")
    assert "returned nan, not a finite number" in _refused("test_rewards:nan")
    nondeterministic = _refused("test_rewards:counter")
    assert "is not deterministic: it returned 0.1 and then 0.2" in nondeterministic


@pytest.mark.slow  # 10 s: the probe waits out the time limit of one call
def test_a_reward_that_hangs_is_refused_at_start(rewards_path):
    assert "no answer within 10 s on problem" in _refused("test_rewards:hangs")


def test_the_spec_must_name_a_module_and_a_function():
    for bad in ("score", "position_reward.score", "position_reward:", "1mod:f", "a:b:c"):
        with pytest.raises(ValidationError, match="must name a function as 'package.module"):
            TaskConfig(reward=bad)
    assert TaskConfig(reward="pkg.sub_mod:score_2").reward == "pkg.sub_mod:score_2"


def test_a_bool_is_a_reward_and_a_failure_after_the_start_scores_zero(rewards_path, caplog):
    exact = load_reward("test_rewards:exact", SOURCE)
    picky = load_reward("test_rewards:picky", SOURCE)  # the probe's completions pass
    try:
        task = SOURCE.get("train", 5)
        answer = task.verification_info["answer"]
        assert exact.score(task, answer) == 1.0 and exact.score(task, answer + "x") == 0.0
        assert picky.score(task, answer) == 0.5
        with caplog.at_level("WARNING", logger="swarmrl.tasks.graders.custom"):
            assert picky.score(task, "boom") == 0.0
        assert "raised ValueError: no bombs (test_rewards.py line" in caplog.text
        assert "scored 0" in caplog.text
    finally:
        exact.close()
        picky.close()


def test_the_fingerprint_follows_the_source_and_a_node_with_another_refuses(rewards_path):
    module = rewards_path / "test_rewards.py"
    first = load_reward("test_rewards:exact", SOURCE)
    first.close()
    assert first.fingerprint.startswith("test_rewards:exact, source ")
    again = load_reward("test_rewards:exact", SOURCE)
    again.close()
    assert again.fingerprint == first.fingerprint
    module.write_text(module.read_text() + "\n# a change anywhere in the module\n")
    changed = load_reward("test_rewards:exact", SOURCE)
    changed.close()
    assert changed.fingerprint != first.fingerprint
    check_pin(first.fingerprint, first.fingerprint)
    with pytest.raises(TaskError) as e:
        check_pin(first.fingerprint, changed.fingerprint)
    assert first.fingerprint in str(e.value) and changed.fingerprint in str(e.value)
    with pytest.raises(TaskError, match="this node's is the task's own verifier"):
        check_pin(first.fingerprint, "")


def test_the_orchestrator_serves_the_pin_and_a_worker_with_another_source_refuses(
    rewards_path, tmp_path
):
    from swarmrl.config import RunConfig
    from tests.unit.orch_util import Orch

    orch = Orch(tmp_path / "orch", 'task.reward="position_reward:score"')
    served = orch.http.get("/v1/run").json()["config"]
    assert served["task"]["reward_fingerprint"].startswith("position_reward:score, source ")
    cfg = RunConfig.model_validate(served)  # what a worker reads from GET /v1/run
    configure_reward(cfg)
    task = SOURCE.get("train", 0)
    assert verify(task, task.verification_info["answer"]) == 1.0
    assert verify(task, "") == 0.0
    other = served["task"]["reward_fingerprint"][:-4] + "0000"
    cfg.task.reward_fingerprint = other
    with pytest.raises(TaskError, match=f"this run's reward is {other}"):
        configure_reward(cfg)


def test_a_validator_rejects_rewards_that_are_not_the_functions(
    rewards_path, random_model_dir, tmp_path
):
    """A file scored by the task's own verifier (a worker that ignores task.reward) is
    rejected by the reward check; files scored by the function pass every check, and
    their rewards are the function's."""
    from bench.rollout_files import Maker, issued, make_judge, small_run
    from swarmrl.protocol.rollouts import read_rollouts

    builtin = small_run(tmp_path, random_model_dir)
    custom = small_run(tmp_path, random_model_dir, 'task.reward="test_rewards:length"')
    key, ignoring = Maker(builtin, tmp_path, name="ignores").file()
    configure_reward(custom)
    judge = make_judge(custom, tmp_path)
    honest_key, honest = Maker(custom, tmp_path, name="honest").file()

    v = judge.judge(honest_key, honest, issued=issued(honest_key))
    assert v.accepted, (v.check, v.reason)
    rows = read_rollouts(honest)
    for r in rows:
        assert r["task_reward"] == pytest.approx(len(r["completion"].strip()) / 40, abs=1e-6)
    assert len({r["task_reward"] for r in rows}) > 1  # not one constant by chance

    v = judge.judge(key, ignoring, issued=issued(key))
    assert not v.accepted and v.check == "reward", (v.check, v.reason)
    assert "claim rewards the verifier does not give" in v.reason


def test_a_reward_that_times_out_on_the_validator_is_unverifiable_not_blamed(
    rewards_path, random_model_dir, tmp_path, monkeypatch
):
    """The worker scored its file in time; on the validator the function runs past its
    limit. That score is the validator's failure, not evidence against the sender: the
    file is `unverifiable` (blameless), and only once the model's checks have passed."""
    from bench.rollout_files import Maker, issued, make_judge, small_run
    from swarmrl.protocol.verdict import BLAMELESS_CHECKS
    from swarmrl.tasks.graders.custom import active_reward

    flag = tmp_path / "slow"
    monkeypatch.setenv("SLOW_FLAG", str(flag))
    cfg = small_run(tmp_path, random_model_dir, 'task.reward="test_rewards:slow_where_flagged"')
    configure_reward(cfg)
    judge = make_judge(cfg, tmp_path)
    key, data = Maker(cfg, tmp_path, name="honest").file()
    flag.write_text("")
    active_reward().checker.timeout_s = 1.0
    v = judge.judge(key, data, issued=issued(key))
    assert not v.accepted and v.check == "unverifiable" and v.check in BLAMELESS_CHECKS
    assert "could not be computed here in time" in v.reason
    assert v.stats  # the model's checks ran first (and passed)
