"""A verifiers taskset's tools in trajectories (`[env] kind = "verifiers"`): the
calls the model writes are answered by the taskset's own toolsets, fresh per
trajectory, in the taskset's checker process; a validator replays them; the
rewards read the tool turns and the tools' state (envs/verifiers_tools.py)."""

import json
import os
import textwrap
from contextlib import contextmanager
from pathlib import Path

import pytest

from bench.rollout_files import Maker, issued, make_judge, small_run
from swarmrl.config import TaskConfig, load_config
from swarmrl.envs import environment as environment_module
from swarmrl.envs.environment import environment_of
from swarmrl.envs.verifiers_tools import DIED, TIME_LIMIT, VerifiersEnvironment, response_text
from swarmrl.errors import ConfigError
from swarmrl.protocol.rollouts import read_rollouts, write_rollouts
from swarmrl.tasks.graders.registry import verify
from swarmrl.tasks.schema import TaskError
from swarmrl.tasks.sources.task_source import TaskSource
from swarmrl.validator.checks import Reject, check_without_model

pytest.importorskip("verifiers", reason="verifiers is in the dev extras")

EXAMPLE_ENV = Path(__file__).resolve().parents[2] / "examples" / "verifiers_env"
TOOLS = TaskConfig(name="verifiers", env="swarmrl-tools-env", env_args={"count": 12})
RUN = ["task.name=verifiers", 'task.env="swarmrl-tools-env"', "task.env_args={count=12}",
       'env.kind="verifiers"', "env.max_turns=3", "sampling.max_prompt_tokens=1024",
       "sampling.max_new_tokens=160"]  # fmt: skip

# test tasksets, written to a directory on the path of this process and its checkers
MODULES = {
    "swarmrl_test_tools_misc": """
        import os, random, time
        import verifiers.v1 as vf

        class Odd(vf.Toolset[vf.ToolsetConfig]):
            TOOL_PREFIX = None

            @vf.tool
            def roll(self) -> int:
                \"\"\"A die nobody seeded.\"\"\"
                return random.SystemRandom().randint(1, 10**9)

        class Slow(vf.Toolset[vf.ToolsetConfig]):
            TOOL_PREFIX = None

            @vf.tool
            def wait(self, seconds: float) -> str:
                \"\"\"Sleeps.\"\"\"
                time.sleep(seconds)
                return "done"

            @vf.tool
            def fail(self) -> str:
                \"\"\"Raises.\"\"\"
                raise ValueError(f"no luck at {object()}")

            @vf.tool
            def chatty(self) -> str:
                \"\"\"Prints before it answers.\"\"\"
                print("a line the tool prints", {"x": 1})
                return "quiet"

            @vf.tool
            def leave(self) -> str:
                \"\"\"Asks the interpreter to exit.\"\"\"
                raise SystemExit(2)

            @vf.tool
            def die(self) -> str:
                \"\"\"Ends its process at once.\"\"\"
                os._exit(3)

        SHARED = Slow(vf.ToolsetConfig())

        class D(vf.TaskData):
            answer: int = 0

        class C(vf.TaskConfig):
            which: str = "odd"

        class T(vf.Task[D, vf.State, C]):
            @classmethod
            def toolsets(cls, config):
                if config.which == "cached":
                    return [SHARED]
                return [Odd(vf.ToolsetConfig())] if config.which == "odd" else [Slow(vf.ToolsetConfig())]

            @vf.reward
            async def right(self, trace) -> float:
                return 1.0

        class TC(vf.TasksetConfig):
            task: C = C()

        class TS(vf.Taskset[T, TC]):
            def load(self):
                return [T(D(id="a", prompt="hi"), self.config.task)]

        __all__ = ["TS"]
    """,
    "swarmrl_test_tools_remote": """
        import verifiers.v1 as vf

        class Far(vf.Toolset[vf.ToolsetConfig]):
            @vf.tool
            def ping(self) -> str:
                \"\"\"Pong.\"\"\"
                return "pong"

        class D(vf.TaskData):
            pass

        class T(vf.Task[D]):
            @classmethod
            def toolsets(cls, config):
                return [Far(vf.ToolsetConfig(url="http://127.0.0.1:9/mcp"))]

            @vf.reward
            async def right(self, trace) -> float:
                return 1.0

        class TS(vf.Taskset[T, vf.TasksetConfig]):
            @classmethod
            def toolsets(cls, config):
                return [Far(vf.ToolsetConfig())]

            def load(self):
                return [T(D(id="a", prompt="hi"), self.config.task)]

        __all__ = ["TS"]
    """,
}


@contextmanager
def importable(directory: Path, modules: dict[str, str]):
    """The example tasksets and `modules` (written to `directory`) on the path of this
    process and of the checker processes it starts."""
    for name, text in modules.items():
        (directory / f"{name}.py").write_text(textwrap.dedent(text))
    with pytest.MonkeyPatch.context() as mp:
        for path in (EXAMPLE_ENV, directory):
            mp.syspath_prepend(str(path))
        mp.setenv(
            "PYTHONPATH",
            os.pathsep.join([str(EXAMPLE_ENV), str(directory), os.environ.get("PYTHONPATH", "")]),
        )
        yield


@pytest.fixture(scope="module", autouse=True)
def tasksets_importable(tmp_path_factory):
    with importable(tmp_path_factory.mktemp("tasksets"), MODULES):
        yield


def call(name: str, **arguments) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


def factors(task) -> tuple[int, int]:
    a, b = task.prompt.rsplit("What is ", 1)[1].split("?")[0].split(" * ")
    return int(a), int(b)


def test_the_prompt_lists_the_tools_then_asks():
    task = TaskSource(TOOLS, 0).get("train", 3)
    tools, question = task.prompt.rsplit("\n\n", 1)
    assert question.startswith("What is ") and '"name": "multiply"' in tools
    assert (
        '"required": ["a", "b"]' in tools and "<tool_call>" in tools and "<tool_response>" in tools
    )


def test_calls_are_answered_from_the_calls_before_them_on_fresh_toolsets():
    env = environment_of(load_config(None, RUN))
    task = TaskSource(TOOLS, 0).get("train", 0)
    first = env.bind(task)
    assert first.respond("I will multiply. " + call("multiply", a=47, b=382), 0) == response_text(
        "17954"
    )
    assert first.respond(call("calls_so_far"), 1) == response_text("1")  # state of this trajectory
    assert first.respond(call("calls_so_far"), 2) is None  # max_turns = 3: the last span
    assert env.bind(task).respond(call("calls_so_far"), 0) == response_text("0")  # a fresh one

    other = env.bind(task)
    assert other.respond("<tool_call>{nope</tool_call>", 0) == response_text(
        "error: the call is not JSON"
    )
    bad = other.respond(call("multiply", a="forty", c=1), 0)
    assert bad == response_text("error: invalid arguments for multiply: a: int_parsing; b: missing")
    assert "pydantic" not in bad  # no library version in an answer a validator recomputes
    assert "no tool named 'divide'" in other.respond(call("divide", a=1, b=2), 0)
    assert other.respond("The answer is 12.", 0) is None and not other.ends("The answer is 12.")


def test_rewards_read_the_tool_turns_and_the_tools_state():
    cfg = TaskConfig(name="verifiers", env="swarmrl-tools-env",
                     env_args={"count": 12, "task": {"require_tool": True}})  # fmt: skip
    task = TaskSource(cfg, 0).get("train", 2)
    a, b = factors(task)
    used = f"Let me see. {call('multiply', a=a, b=b)} {response_text(str(a * b))}So it is {a * b}"
    assert verify(task, used) == 1.0
    assert verify(task, f"It is {a * b}") == 0.0  # right, but the tool never computed it
    forged = f"{call('multiply', a=a, b=b)}{response_text(str(a * b + 1))}So it is {a * b}"
    assert verify(task, forged) == 0.0  # the written answer is not the tool's: no tool turn


def _trajectory(tok, eos: int, spans: list[tuple[str, int]]) -> tuple[list[int], list[int]]:
    ids, mask = [], []
    for text, model in spans:
        piece = tok(text, add_special_tokens=False)["input_ids"]
        ids += piece
        mask += [model] * len(piece)
    return ids + [eos], mask + [1]


def test_a_file_of_tool_trajectories_is_checked_by_replaying_the_calls(random_model_dir, tmp_path):
    cfg = small_run(tmp_path, random_model_dir, *RUN)
    maker, judge = Maker(cfg, tmp_path), make_judge(cfg, tmp_path)
    key, data = maker.file()  # the random model writes no call: one span each, accepted
    v = judge.judge(key, data, issued=issued(key))
    assert v is not None and v.accepted, (v.check, v.reason)

    tok, eos = maker.tokenizer, maker.tokenizer.eos_token_id
    tasks = {maker.source.get("train", i).problem_id: maker.source.get("train", i)
             for i in range(maker.source.n_records)}  # fmt: skip

    def rewrite(rows, answer_of):
        out = []
        for r in rows:
            a, b = factors(tasks[r["problem_id"]])
            spans = [(f"Use the tool. {call('multiply', a=a, b=b)}", 1),
                     (response_text(answer_of(a * b)), 0), (f"It is {a * b}", 1)]  # fmt: skip
            ids, mask = _trajectory(tok, eos, spans)
            text = tok.decode(ids[:-1], skip_special_tokens=True)
            reward = verify(tasks[r["problem_id"]], text)
            out.append({**r, "completion": text, "completion_tokens": ids, "completion_mask": mask,
                        "completion_logprobs": [0.0] * len(ids), "task_reward": reward,
                        "reward": reward})  # fmt: skip
        return out

    ctx = judge.ctx.with_issued(issued(key))
    honest = rewrite(read_rollouts(data), str)
    assert all(r["task_reward"] == 1.0 for r in honest)
    check_without_model(ctx, key, write_rollouts(honest))  # the replayed calls agree

    forged = rewrite(read_rollouts(data), lambda p: str(p + 1))
    with pytest.raises(Reject) as e:
        check_without_model(ctx, key, write_rollouts(forged))
    assert e.value.check == "environment", e.value.reason

    past = [dict(r) for r in honest]  # the model's span goes on after its call
    mask = past[0]["completion_mask"]
    first_env = mask.index(0)
    past[0]["completion_mask"] = mask[:first_env] + [1] + mask[first_env + 1 :]
    with pytest.raises(Reject) as e:
        check_without_model(ctx, key, write_rollouts(past))
    assert e.value.check == "termination", e.value.reason


def test_a_tool_taskset_needs_the_verifiers_environment_and_that_one_a_tool_taskset():
    no_env = [r for r in RUN if not r.startswith("env.kind")]
    with pytest.raises(ConfigError, match="set \\[env\\] kind = 'verifiers'"):
        environment_of(load_config(None, no_env))
    arith = ["task.name=verifiers", 'task.env="swarmrl-arith-env"', 'env.kind="verifiers"']
    with pytest.raises(ConfigError, match="a taskset whose tasks have tools"):
        environment_of(load_config(None, arith))


def test_tools_that_answer_differently_are_refused_at_start():
    cfg = load_config(None, ["task.name=verifiers", 'task.env="swarmrl-test-tools-misc"',
                             'env.kind="verifiers"'])  # fmt: skip
    with pytest.raises(ConfigError, match="not deterministic: .*roll"):
        environment_of(cfg)
    assert environment_module.built_key(cfg) not in environment_module._BUILT


def test_shared_and_remote_toolsets_are_refused_with_the_reason():
    with pytest.raises(TaskError) as e:
        TaskSource(TaskConfig(name="verifiers", env="swarmrl-test-tools-remote"), 0)
    assert "shared by the whole taskset" in str(e.value)
    assert "remote server (http://127.0.0.1:9/mcp)" in str(e.value)


SLOW = TaskConfig(name="verifiers", env="swarmrl-test-tools-misc",
                  env_args={"task": {"which": "slow"}})  # fmt: skip


def test_a_tool_past_its_time_limit_or_whose_process_dies_cannot_be_settled():
    task = TaskSource(SLOW, 0).get("train", 0)
    env = VerifiersEnvironment(max_turns=8, timeout_s=1.0)
    tools = env.bind(task)
    assert tools.respond(call("wait", seconds=0), 0) == response_text("done")
    # a tool's exception is answered by its type only: its message here holds an address
    assert tools.respond(call("fail"), 1) == response_text("error: the tool raised ValueError")
    assert tools.respond(call("leave"), 2) == response_text("error: the tool raised SystemExit")
    slow = call("wait", seconds=5)
    late = tools.respond(slow, 3)
    assert late == response_text(TIME_LIMIT)
    # a worker that got "done" where this validator ran out of time is not called a forger
    assert "ran out of time" in tools.doubt(slow, 3, late, response_text("done"))
    dying = env.bind(task)
    assert dying.respond(call("die"), 0) == response_text(DIED)
    assert "died" in dying.doubt(call("die"), 0, response_text(DIED), response_text("ok"))
    fast = env.bind(task)
    assert fast.doubt(call("wait", seconds=0), 0, response_text("done"), "x") is None
    env.checker.close()


def test_what_a_tool_prints_does_not_shift_the_answers():
    task = TaskSource(SLOW, 0).get("train", 0)
    env = VerifiersEnvironment(max_turns=8, timeout_s=5.0)
    tools = env.bind(task)
    assert tools.respond(call("chatty"), 0) == response_text("quiet")
    assert tools.respond(call("wait", seconds=0), 1) == response_text("done")
    assert env.bind(task).respond(call("wait", seconds=0), 0) == response_text("done")
    env.checker.close()


@pytest.mark.slow  # 18 s
def test_a_trajectory_cut_where_the_validator_ran_out_of_time_is_not_a_forgery():
    """The worker's answer did not fit in the budget, so its trajectory ends at the
    call; this validator's tools ran out of time, and its short answer would fit:
    unverifiable, not `environment`."""
    from swarmrl.inference.trajectory import replay
    from swarmrl.models.tiny import build_char_tokenizer

    tok = build_char_tokenizer()
    task = TaskSource(SLOW, 0).get("train", 0)
    env = VerifiersEnvironment(max_turns=4, timeout_s=1.0)
    ids = tok(call("wait", seconds=5), add_special_tokens=False)["input_ids"]
    got = replay(env.bind(task), tok, ids, [1] * len(ids), tok.eos_token_id, len(ids) + 60)
    assert got is not None and got[0] == "unverifiable", got
    quick = tok(call("wait", seconds=0), add_special_tokens=False)["input_ids"]
    got = replay(env.bind(task), tok, quick, [1] * len(quick), tok.eos_token_id, len(quick) + 60)
    assert got is not None and got[0] == "environment", got  # "done" fits, and was left out
    env.checker.close()


def test_toolsets_that_are_not_fresh_per_trajectory_are_refused():
    cfg = TaskConfig(name="verifiers", env="swarmrl-test-tools-misc",
                     env_args={"task": {"which": "cached"}})  # fmt: skip
    with pytest.raises(TaskError, match="the same object on every call of toolsets"):
        TaskSource(cfg, 0)


def test_an_unanswered_last_call_is_not_run_for_the_reward():
    from swarmrl.envs.verifiers_tools import split_turns
    from swarmrl.tasks.sources.environments import task_row

    task = TaskSource(TOOLS, 0).get("train", 1)
    row = task_row(task.verification_info)
    a, b = factors(task)
    turns, state = split_turns(row, f"I will call. {call('multiply', a=a, b=b)}")
    assert turns == [
        ("I will call. ", json.dumps({"name": "multiply", "arguments": {"a": a, "b": b}}), None)
    ]
    assert state.calls == 0 and state.products == []
    # a close tag with the model's own text after it did not end a span
    text = (
        f"{call('multiply', a=1, b=2)}more{call('multiply', a=a, b=b)}{response_text(str(a * b))}ok"
    )
    turns, state = split_turns(row, text)
    assert [t[2] for t in turns] == [str(a * b), None] and state.calls == 1


def test_every_node_runs_the_runs_taskset_and_library_versions(tmp_path):
    """The orchestrator serves its taskset's fingerprint (the verifiers and pydantic
    versions, a hash of the taskset's files); a node whose own differs refuses to build
    the run's tasks, naming both."""
    from swarmrl.tasks.sources.environments import check_fingerprint, fingerprint
    from tests.unit.orch_util import Orch

    served = Orch(tmp_path / "a", *RUN).http.get("/v1/run").json()["config"]["task"]
    assert served["env_fingerprint"] == fingerprint("swarmrl-tools-env", '{"count": 12}')
    assert served["env_fingerprint"].startswith("verifiers 0.")
    assert served["env_fingerprint"] != fingerprint("swarmrl-tools-env", '{"count": 13}')
    ok = TOOLS.model_copy(update={"env_fingerprint": served["env_fingerprint"]})
    assert TaskSource(ok, 0).n_records == 12
    other = served["env_fingerprint"].replace("taskset ", "taskset 0")[:-1]
    with pytest.raises(TaskError, match="install the run's versions"):
        TaskSource(TOOLS.model_copy(update={"env_fingerprint": other}), 0)

    # the hash follows the taskset's code (every .py file of its package), not the other
    # files there (a cache the taskset writes when it loads)
    package = tmp_path / "swarmrl_test_fingerprint"
    package.mkdir()
    (package / "__init__.py").write_text("from .ts import TS\n__all__ = ['TS']\n")
    (package / "ts.py").write_text(textwrap.dedent(MODULES["swarmrl_test_tools_misc"]))
    with pytest.MonkeyPatch.context() as mp:
        mp.syspath_prepend(str(tmp_path))
        before = fingerprint("swarmrl-test-fingerprint")
        (package / "cache.json").write_text("{}")
        fingerprint.cache_clear()
        assert fingerprint("swarmrl-test-fingerprint") == before
        (package / "ts.py").write_text((package / "ts.py").read_text().replace("no luck", "no"))
        fingerprint.cache_clear()
        after = fingerprint("swarmrl-test-fingerprint")
    assert before != after and before.split("taskset")[0] == after.split("taskset")[0]
    check_fingerprint(TOOLS)  # no pin: a node's own config before it has the run's


def test_in_tool_turns_a_call_is_answered_with_its_output_and_rewards_read_the_spans():
    """`env.tool_turns = "template"`: the answer is the output alone (the chat template
    wraps it in a tool turn), and the reward rebuilds the turns from the model's spans,
    which the decoded text (template tokens dropped) no longer shows."""
    env = environment_of(load_config(None, [*RUN, 'env.tool_turns="template"']))
    cfg = TaskConfig(name="verifiers", env="swarmrl-tools-env",
                     env_args={"count": 12, "task": {"require_tool": True}})  # fmt: skip
    task = TaskSource(cfg, 0).get("train", 2)
    a, b = factors(task)
    tools = env.bind(TaskSource(TOOLS, 0).get("train", 2))
    assert tools.turn_role == "tool" and not tools.ends(call("multiply", a=a, b=b))
    assert tools.respond(call("multiply", a=a, b=b), 0) == str(a * b)
    replies = [f"Let me see. {call('multiply', a=a, b=b)}", f"So it is {a * b}"]
    text = (
        f"{replies[0]}\nuser\n<tool_response>\n{a * b}\n</tool_response>\nassistant\n{replies[1]}"
    )
    assert verify(task, text, replies) == 1.0
    assert verify(task, text) == 0.0  # read from the text alone, no tool turn shows
    assert verify(task, text, [f"So it is {a * b}"]) == 0.0  # the tool never computed it
    env.checker.close()
