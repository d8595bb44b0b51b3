"""Tasks from the ecosystem: reasoning-gym families and verifiers tasksets as task
sources; their rewards re-scored identically by the validator from a rollout file."""

import os
import textwrap
from pathlib import Path

import pytest

from bench.rollout_files import Maker, issued, make_judge, small_run
from swarmrl.config import TaskConfig
from swarmrl.protocol.rollouts import read_rollouts, write_rollouts
from swarmrl.tasks.graders.registry import verify
from swarmrl.tasks.schema import TaskError
from swarmrl.tasks.sources.task_source import TaskSource
from swarmrl.validator.checks import Reject, check_without_model

pytest.importorskip("reasoning_gym", reason="reasoning-gym is in the dev extras")
pytest.importorskip("verifiers", reason="verifiers is in the dev extras")

EXAMPLE_ENV = Path(__file__).resolve().parents[2] / "examples" / "verifiers_env"
GYM = TaskConfig(name="reasoning_gym", gym=["basic_arithmetic", "chain_sum"])
ENV = TaskConfig(name="verifiers", env="swarmrl-arith-env", env_args={"count": 40})


@pytest.fixture(scope="module", autouse=True)
def example_env_importable():
    """The example taskset on the path of this process and of the checker processes."""
    with pytest.MonkeyPatch.context() as mp:
        mp.syspath_prepend(str(EXAMPLE_ENV))
        mp.setenv(
            "PYTHONPATH", os.pathsep.join([str(EXAMPLE_ENV), os.environ.get("PYTHONPATH", "")])
        )
        yield


def gym_answer(task) -> str:
    from swarmrl.tasks.sources.gym import _entry

    return _entry(task.verification_info)[1]["answer"]


def env_answer(task) -> int:
    from swarmrl.tasks.sources.environments import _load

    info = task.verification_info
    import json

    return _load(info["env"], json.dumps(info["args"], sort_keys=True))[info["row"]].data.answer


def test_gym_problems_are_a_function_of_seed_split_and_index():
    a, b = TaskSource(GYM, 7), TaskSource(GYM, 7)
    assert [a.get("train", i) for i in range(6)] == [b.get("train", i) for i in range(6)]
    fams = [a.get("train", i).verification_info["family"] for i in range(4)]
    assert fams == ["basic_arithmetic", "chain_sum"] * 2
    train = {a.get("train", i).prompt for i in range(40)}
    held_out = {a.get("eval", i).prompt for i in range(40)}
    assert len(train & held_out) <= 2  # different items (tiny sums can coincide)
    assert a.get("train", 0) != TaskSource(GYM, 8).get("train", 0)
    assert "<answer></answer>" in a.get("train", 0).prompt


def test_gym_tasks_are_graded_by_their_family_scorer():
    src = TaskSource(GYM, 3)
    for i in range(4):
        task = src.get("train", i)
        right = gym_answer(task)
        assert verify(task, f"Let me think. <answer>{right}</answer>") == 1.0
        assert verify(task, f"<answer>{right}</answer> then <answer>{right}1</answer>") < 1.0
        assert verify(task, right) == 0.0  # no tag, no answer


@pytest.mark.parametrize(
    "cfg, says",
    [
        (
            TaskConfig(name="reasoning_gym", gym=["no_such_family"]),
            "unknown reasoning-gym families",
        ),
        (
            TaskConfig(name="reasoning_gym", gym=["chain_sum"], gym_options={"gcd": {}}),
            "not in task.gym",
        ),
        (
            TaskConfig(
                name="reasoning_gym", gym=["chain_sum"], gym_options={"chain_sum": {"bogus": 1}}
            ),
            "family 'chain_sum' cannot generate",
        ),
        (TaskConfig(name="verifiers", env="no-such-env-here"), "cannot load the taskset"),
        (
            TaskConfig(name="verifiers", env="swarmrl-arith-env", env_args={"cont": 3}),
            "task.env_args",
        ),
    ],
)
def test_bad_source_configs_say_what_is_wrong(cfg, says):
    with pytest.raises(TaskError) as e:
        TaskSource(cfg, 0)
    assert says in str(e.value)


def test_env_rows_become_tasks_graded_by_the_taskset_rewards():
    src = TaskSource(ENV, 0)
    assert src.n_records == 40
    task = src.get("train", 5)
    assert task.prompt.startswith("Answer with the number only.\n\nWhat is ")
    assert src.get("eval", 45) == task  # rows wrap, the same for both splits
    right = env_answer(task)
    assert verify(task, f"The answer is {right}") == 1.0
    assert verify(task, f"The answer is {right + 1}") == 0.0


def test_multi_turn_and_tool_tasksets_are_refused_with_the_reason(tmp_path, monkeypatch):
    (tmp_path / "swarmrl_test_multiturn.py").write_text(
        textwrap.dedent(
            """
            import verifiers.v1 as vf

            class D(vf.TaskData):
                answer: int

            class T(vf.Task[D]):
                @vf.reward
                async def right(self, trace, runtime) -> float:
                    return 1.0

            class TS(vf.Taskset[T, vf.TasksetConfig]):
                def load(self):
                    return [T(D(id="a", prompt="hi", answer=1), self.config.task)]

            __all__ = ["TS"]
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(TaskError) as e:
        TaskSource(TaskConfig(name="verifiers", env="swarmrl-test-multiturn"), 0)
    assert "not a taskset swarmrl can grade offline" in str(e.value) and "needs a runtime" in str(
        e.value
    )


def _with_right_answers(maker, rows, answer):
    """The rows of an honest file with every completion replaced by the right answer
    (ending on EOS, so the file stays well-formed) and the rewards the worker would claim."""
    tok = maker.tokenizer
    out = []
    for r in rows:
        task = _task_of(maker, r)
        text = answer(task)
        ids = tok(text, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
        reward = verify(task, text)
        out.append({**r, "completion": text, "completion_tokens": ids,
                    "completion_logprobs": [0.0] * len(ids), "completion_mask": [1] * len(ids),
                    "task_reward": reward, "reward": reward})  # fmt: skip
    return out


def _task_of(maker, row):
    """The task a row was generated from, found from its problem id."""
    cfg = maker.source.cfg
    if cfg.name == "reasoning_gym":  # "family/split/item" is index item * families + family
        family, _, item = row["problem_id"].split("/")
        return maker.source.get("train", int(item) * len(cfg.gym) + cfg.gym.index(family))
    for i in range(maker.source.n_records):  # a taskset's rows wrap
        t = maker.source.get("train", i)
        if t.problem_id == row["problem_id"]:
            return t
    raise AssertionError(f"no task has the row's problem id {row['problem_id']}")


@pytest.mark.parametrize(
    "overrides, answer",
    [
        (["task.name=reasoning_gym", 'task.gym=["basic_arithmetic", "chain_sum"]'],
         lambda t: f"<answer>{gym_answer(t)}</answer>"),
        (["task.name=verifiers", 'task.env="swarmrl-arith-env"', "task.env_args={count=30}"],
         lambda t: str(env_answer(t))),
    ],
    ids=["reasoning_gym", "verifiers"],
)  # fmt: skip
def test_rollout_files_round_trip_and_rewards_are_re_scored(
    random_model_dir, tmp_path, overrides, answer
):
    cfg = small_run(tmp_path, random_model_dir, *overrides, "sampling.max_prompt_tokens=512")
    maker = Maker(cfg, tmp_path)
    judge = make_judge(cfg, tmp_path)
    key, data = maker.file()
    verdict = judge.judge(key, data, issued=issued(key))
    assert verdict is not None and verdict.accepted, (verdict.check, verdict.reason)

    rows = _with_right_answers(maker, read_rollouts(data), answer)
    assert all(r["task_reward"] == 1.0 for r in rows)
    check_without_model(
        judge.ctx.with_issued(issued(key)), key, write_rollouts(rows)
    )  # re-scored: the same rewards
    rows[1] = {**rows[1], "task_reward": 0.0, "reward": 0.0}  # under-claimed: also caught
    with pytest.raises(Reject) as e:
        check_without_model(judge.ctx.with_issued(issued(key)), key, write_rollouts(rows))
    assert e.value.check == "reward"


def test_a_datasets_directory_is_a_task_file(tmp_path):
    import datasets

    from swarmrl.tasks.sources.task_source import load_task_file

    rows = [{"problem_id": f"p{i}", "prompt": f"What is {i} + 1?", "task_type": "addition",
             "verification_info": f'{{"answer": "{i + 1}"}}'} for i in range(5)]  # fmt: skip
    datasets.Dataset.from_list(rows).save_to_disk(str(tmp_path / "plain"))
    tasks = load_task_file(tmp_path / "plain")
    assert [t.problem_id for t in tasks] == [f"p{i}" for i in range(5)]
    assert tasks[2].verification_info == {"answer": "3"}

    datasets.DatasetDict({"train": datasets.Dataset.from_list(rows)}).save_to_disk(
        str(tmp_path / "dd")
    )
    assert len(load_task_file(tmp_path / "dd")) == 5

    bad = [*rows[:3], {**rows[3], "task_type": "chess"}, rows[4]]
    datasets.Dataset.from_list(bad).save_to_disk(str(tmp_path / "bad"))
    with pytest.raises(TaskError) as e:
        load_task_file(tmp_path / "bad")
    assert f"{tmp_path / 'bad'} row 3: field 'task_type'" in str(e.value)

    (tmp_path / "empty_dir").mkdir()
    with pytest.raises(TaskError, match="not one saved by datasets"):
        load_task_file(tmp_path / "empty_dir")
