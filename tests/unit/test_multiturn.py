"""Multi-turn rollouts through worker, validator and trainer (issue 26): an honest
trajectory file is accepted and trained on with the environment's tokens masked; each
cheat of the environment's part is rejected at its check; a file of the single-turn
format before trajectories still validates.

The random tiny model never writes a calculator call, so the model-level tests run
with `Echo`, a deterministic environment that ends a span after three characters and
answers them reversed, installed as the run's environment (`environment_of`'s cache).
The calculator's own cheats are checked on hand-written trajectories (`replay`)."""

from __future__ import annotations

import io

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from bench.rollout_files import Maker, issued, make_judge, small_run
from bench.trajectory_envs import Echo
from swarmrl.envs import environment as environment_module
from swarmrl.envs.environment import ToolEnvironment, environment_of
from swarmrl.envs.tools import CalcLimits
from swarmrl.inference.trajectory import replay
from swarmrl.models.tiny import build_char_tokenizer
from swarmrl.protocol.rollouts import SCHEMA_V1, Limits, read_rollouts, spans
from swarmrl.sim.registry import make_cheat
from swarmrl.sim.tool_cheats import loosened
from swarmrl.trainer.batch import BatchCollector
from tests.unit.test_store_and_batch import MemoryQueue


@pytest.fixture(scope="module")
def echo_run(random_model_dir, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("multiturn")
    cfg = small_run(tmp, random_model_dir, 'env.kind="tools"', "env.max_turns=3")
    key = environment_module.built_key(cfg)
    had = environment_module._BUILT.get(key)
    environment_module._BUILT[key] = Echo()
    yield cfg, tmp, make_judge(cfg, tmp), Maker(cfg, tmp, name="worker")
    environment_module._BUILT.pop(key)
    if had is not None:
        environment_module._BUILT[key] = had


def test_a_trajectory_file_is_accepted_and_trained_on_with_the_environment_masked(echo_run):
    cfg, tmp, judge, maker = echo_run
    key, data = maker.file()
    rows = read_rollouts(data)
    masks = [r["completion_mask"] for r in rows]
    assert any(len(spans(m)) >= 3 for m in masks), masks  # the environment answered
    for r in rows:
        pairs = zip(r["completion_logprobs"], r["completion_mask"], strict=True)
        env_lp = [lp for lp, m in pairs if not m]
        assert env_lp == [0.0] * len(env_lp)
    v = judge.judge(key, data, issued=issued(key))
    assert v.accepted, (v.check, v.reason)

    q = MemoryQueue()
    q.put(key, data, {"accepted": True})
    limits = Limits(group_size=cfg.worker.group_size, max_turns=cfg.env.max_turns)
    batch = BatchCollector(q, limits, async_level=2, poll_s=0.01).collect(1, 1)
    assert batch.samples, "nothing to train on"
    for s in batch.samples:
        row = next(r for r in rows if r["completion_tokens"] == s.completion_tokens)
        want = None if all(row["completion_mask"]) else row["completion_mask"]
        assert s.completion_mask == want
    from swarmrl.config import TrainerConfig
    from swarmrl.models.loading import load_model
    from swarmrl.trainer.step import grpo_update

    model = load_model(str(cfg.model.path), "float32")
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    stats = grpo_update(model, None, opt, batch.samples, TrainerConfig(micro_batch=8), 40.0, 1)
    assert stats.tokens == sum(s.model_tokens for s in batch.samples)
    assert stats.tokens < sum(len(s.completion_tokens) for s in batch.samples)


# the check each cheat of the environment's part is caught at
TOOL_CHEATS = {
    "forged-tool-result": {"environment"},
    "dropped-turn": {"environment"},
    "edited-after-tool": {"sampling"},
}


@pytest.mark.parametrize("cheat", sorted(TOOL_CHEATS))
def test_each_cheat_of_the_environments_part_is_rejected(echo_run, cheat):
    cfg, tmp, judge, maker = echo_run
    for rep in range(2):
        key, data = maker.file(make_cheat(cheat, seed=rep))
        assert any(len(spans(r["completion_mask"])) >= 3 for r in read_rollouts(data))
        v = judge.judge(key, data, issued=issued(key))
        assert not v.accepted, f"{cheat} file {rep} accepted"
        assert v.check in TOOL_CHEATS[cheat], (v.check, v.reason)
        assert v.samples and v.reason


class Unsettled(Echo):
    """A worker's environment whose every answer is one the validator cannot settle."""

    def respond(self, span: str, turn: int) -> str | None:
        return None if super().respond(span, turn) is None else "[?]"


class Doubting(Echo):
    """A validator's environment for which "[?]" may be nobody's fault (as the Python
    tool's time limit is: machines differ in speed)."""

    def doubt(self, span: str, turn: int, answer: str, claimed: str) -> str | None:
        return "the answer could not be settled" if claimed == "[?]" else None


def test_an_unsettled_answer_is_refused_as_such_only_when_nothing_else_is_wrong(echo_run):
    """Through the validator's whole loop (Judge.judge): a file whose only fault is an
    answer the validator cannot settle is refused as `unverifiable` (blameless); the
    same doubt beside a model span edited after the tool answered is `sampling`."""
    cfg, tmp, judge, maker = echo_run
    env_key = environment_module.built_key(cfg)
    environment_module._BUILT[env_key] = Unsettled()
    try:
        unsettled = maker.file()
        edited = maker.file(make_cheat("edited-after-tool", seed=0))
    finally:
        environment_module._BUILT[env_key] = Doubting()
    try:
        v = judge.judge(*unsettled, issued=issued(unsettled[0]))
        assert not v.accepted and v.check == "unverifiable", (v.check, v.reason)
        v = judge.judge(*edited, issued=issued(edited[0]))
        assert not v.accepted and v.check == "sampling", (v.check, v.reason)
    finally:
        environment_module._BUILT[env_key] = Echo()


def test_a_file_of_the_format_before_trajectories_still_validates(random_model_dir, tmp_path):
    cfg = small_run(tmp_path, random_model_dir)
    maker = Maker(cfg, tmp_path, name="old")
    key, data = maker.file()
    rows = [{k: v for k, v in r.items() if k != "completion_mask"} for r in read_rollouts(data)]
    buf = io.BytesIO()
    pq.write_table(pa.Table.from_pylist(rows, schema=SCHEMA_V1), buf, compression="zstd")
    assert b"swarmrl.rollouts" not in buf.getvalue()  # no version key: version 1
    v = make_judge(cfg, tmp_path).judge(key, buf.getvalue(), issued=issued(key))
    assert v.accepted, (v.check, v.reason)
    # and a trajectory is refused where the run has no environment (one turn per row)
    with pytest.raises(Exception, match="model turns, over the limit of 1"):
        read_rollouts(_two_turns(data), Limits(max_turns=cfg.env.turn_limit))


def _two_turns(data: bytes) -> bytes:
    from swarmrl.protocol.rollouts import write_rollouts

    rows = read_rollouts(data)
    r = rows[0]
    n = len(r["completion_tokens"])
    if n < 3:
        r["completion_tokens"] = r["completion_tokens"] * 3
        r["completion_logprobs"] = r["completion_logprobs"] * 3
        n *= 3
    mask = [1] * n
    mask[1] = 0
    r["completion_mask"] = mask
    r["completion_logprobs"] = [0.0 if not m else lp for lp, m in
                                zip(r["completion_logprobs"], mask, strict=True)]  # fmt: skip
    return write_rollouts(rows)


# --- the calculator's rules, on trajectories written by hand (character tokens)


TOK = build_char_tokenizer()
EOS = TOK.eos_token_id


def _trajectory(*parts: tuple[str, int], eos: bool = True) -> tuple[list[int], list[int]]:
    tokens, mask = [], []
    for text, who in parts:
        ids = TOK(text, add_special_tokens=False)["input_ids"]
        tokens += ids
        mask += [who] * len(ids)
    if eos:
        tokens.append(EOS)
        mask.append(1)
    return tokens, mask


def _replay(env, *parts, eos=True, limit=200):
    tokens, mask = _trajectory(*parts, eos=eos)
    return replay(env, TOK, tokens, mask, EOS, limit)


def test_the_calculators_trajectories_are_replayed_turn_by_turn():
    env = ToolEnvironment(max_turns=3, limits=CalcLimits(max_digits=20))
    call, answer = "x <calc>48 * 21</calc>", "<result>1008</result>\n"
    assert _replay(env, (call, 1), (answer, 0), ("so 1008", 1)) is None
    # a forged result
    got = _replay(env, (call, 1), ("<result>1009</result>\n", 0), ("so 1009", 1))
    assert got[0] == "environment" and "not what the environment answers" in got[1]
    # turns reordered: the second call's answer after the first call
    call2, answer2 = " and <calc>7 * 6</calc>", "<result>42</result>\n"
    honest = [(call, 1), (answer, 0), (call2, 1), (answer2, 0), ("done", 1)]
    assert _replay(env, *honest) is None
    swapped = [(call, 1), (answer2, 0), (call2, 1), (answer, 0), ("done", 1)]
    assert _replay(env, *swapped)[0] == "environment"
    # a turn dropped at the end: the trajectory stops at a call the environment answers
    got = _replay(env, (call, 1), eos=False)
    assert got[0] == "environment" and "stops where the environment answers" in got[1]
    # past the turn limit (3 model spans): the third call is not answered
    third = [*honest[:4], (" <calc>1+1</calc>", 1), ("<result>2</result>\n", 0), ("x", 1)]
    assert "ends the trajectory here" in _replay(env, *third)[1]
    assert _replay(env, *honest[:4], (" <calc>1+1</calc>", 1), eos=False) is None
    # a span that goes on after its call, or ends with none
    assert _replay(env, (call + " more", 1), (answer, 0), ("x", 1))[0] == "termination"
    assert _replay(env, ("no call", 1), (answer, 0), ("x", 1))[0] == "termination"
    assert _replay(env, ("no call, no end", 1), eos=False)[0] == "termination"
    assert _replay(env, ("cut at the budget", 1), eos=False, limit=17) is None


def test_the_json_form_of_a_call_is_answered_and_replayed():
    """The Hermes form of Qwen-style templates (env.syntax = "json") for the built-in
    tools: read, answered, and checked by the replay like the tag form."""
    env = ToolEnvironment(tools=("calc",), max_turns=3, syntax="json")
    calc = '<tool_call>{"name": "calc", "arguments": {"expression": "48 * 21"}}</tool_call>'
    answer = "<tool_response>1008</tool_response>\n"
    assert env.respond("Let me compute. " + calc, 0) == answer
    assert env.respond("<calc>48 * 21</calc>", 0) is None  # the tag is not this run's form
    bad = {
        "<tool_call>{nope</tool_call>": "the call is not JSON",
        '<tool_call>{"name": "shell", "arguments": {}}</tool_call>': '{"name": "calc" or',
        '<tool_call>{"name": "calc", "arguments": {"expr": "1"}}</tool_call>': 'one argument, "expression"',
    }  # fmt: skip
    deep = (
        '{"name": "calc", "arguments": {"expression": "1", "x": ' + "[" * 2000 + "]" * 2000 + "}}"
    )
    bad["<tool_call>" + deep + "</tool_call>"] = "nests deeper than 32 levels"  # at any stack depth
    bad['<tool_call>{"name": ["calc"], "arguments": {}}</tool_call>'] = '{"name": "calc" or'
    bad['<tool_call>{"name": "calc", "arguments": {"expression": "\\ud800"}}</tool_call>'] = (
        "not text UTF-8 can hold"
    )
    for call, says in bad.items():
        assert env.ends(call) and says in env.respond(call, 0), call
    # the probes at start are written in the run's form
    probes = environment_module.probes_for("json")
    assert any('"expression": "2 ** 300"' in p for p in probes)
    assert not any(p.startswith("<calc>") for p in probes)
    assert "not offered" in env.respond(
        '<tool_call>{"name": "python", "arguments": {"code": "print(1)"}}</tool_call>', 0
    )
    assert _replay(env, ("x " + calc, 1), (answer, 0), ("so 1008", 1)) is None
    forged = "<tool_response>1009</tool_response>\n"
    assert _replay(env, ("x " + calc, 1), (forged, 0), ("so 1009", 1))[0] == "environment"
    assert _replay(env, ("x " + calc + " more", 1), (answer, 0), ("x", 1))[0] == "termination"


def test_a_tool_run_with_looser_limits_is_caught_by_the_runs_limits():
    """The run's limits hold on workers and validators alike: both build the calculator
    from `[env]`; a worker that loosens them answers what the validator's does not."""
    from swarmrl.config import load_config

    cfg = load_config(None, ['env.kind="tools"', "env.max_digits=30", "env.max_turns=2"])
    env = environment_of(cfg)
    assert env.limits == CalcLimits(max_digits=30) and env.max_turns == 2
    call = "<calc>9 ** 40</calc>"  # 39 digits
    strict = env.respond(call, 0)
    assert strict == "<result>error: power too large</result>\n"
    loose = loosened(env).respond(call, 0)
    assert loose == f"<result>{9**40}</result>\n"
    assert _replay(env, (call, 1), (strict, 0), ("ok", 1)) is None
    got = _replay(env, (call, 1), (loose, 0), ("ok", 1))
    assert got[0] == "environment", got


def test_the_held_out_evaluation_runs_the_tool_greedily(random_model_dir):
    """With the run's environment, the held-out score is of greedy trajectories, graded
    on their whole text, and says how many used the tool; the same twice."""
    from swarmrl.apps.evaluate import evaluate
    from swarmrl.config import TaskConfig

    task = TaskConfig(name="reverse_text", min_len=3, max_len=8)
    runs = [evaluate(str(random_model_dir), task, 6, 20, threads=1, env=Echo()) for _ in "ab"]
    assert runs[0]["tool_use"] > 0 and runs[0]["samples"] == runs[1]["samples"]
    assert any("[" in s["completion"] for s in runs[0]["samples"])  # the answers are in it
    plain = evaluate(str(random_model_dir), task, 6, 20, threads=1)
    assert "tool_use" not in plain and plain["samples"] != runs[0]["samples"]


def test_the_launcher_refuses_tool_cheats_in_a_run_without_tools():
    from swarmrl.launch.swarm import LaunchError, _cheat_list

    with pytest.raises(LaunchError, match="would be honest workers"):
        _cheat_list(2, ["truncate", "forged-tool-result"])
    assert _cheat_list(2, ["truncate", "forged-tool-result"], multi_turn=True) == [
        "truncate", "forged-tool-result"
    ]  # fmt: skip


# a ChatML template with a tool role, written for this test: a tool message becomes a
# user turn holding <tool_response>...</tool_response>, the convention of Qwen-style models
TOOL_TEMPLATE = (
    "{% for m in messages %}{% if m.role == 'tool' %}<|im_start|>user\n<tool_response>\n"
    "{{ m.content }}\n</tool_response><|im_end|>\n{% else %}<|im_start|>{{ m.role }}\n"
    "{{ m.content }}<|im_end|>\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def test_a_call_answered_in_a_tool_turn_of_the_chat_template():
    """`env.tool_turns = "template"`: the model ends its turn after the call, and the
    answer is rendered as the template renders a tool message; the validator replays
    it by the same rule."""
    from swarmrl.errors import ConfigError
    from swarmrl.inference.trajectory import env_ids
    from swarmrl.models.loading import load_tokenizer

    tok = load_tokenizer("smollm2")
    tok.chat_template = TOOL_TEMPLATE
    eos = tok.eos_token_id
    env = ToolEnvironment(("calc",), max_turns=3, syntax="json", tool_turns="template")
    call = '<tool_call>{"name": "calc", "arguments": {"expression": "47 * 382"}}</tool_call>'
    assert not env.ends("Let me compute. " + call)  # only the end of turn ends a span
    assert env.respond("Let me compute. " + call, 0) == "17954"
    turn = "\n<|im_start|>user\n<tool_response>\n17954\n</tool_response><|im_end|>\n"
    turn += "<|im_start|>assistant\n"
    assert env_ids(env, tok, "17954") == tok(turn, add_special_tokens=False)["input_ids"]

    def trajectory(parts):
        ids, mask = [], []
        for text, model in parts:
            piece = tok(text, add_special_tokens=False)["input_ids"] if model else text
            piece = piece + [eos] if model == 1 else piece
            ids += piece
            mask += [1 if model else 0] * len(piece)
        return ids, mask

    def check(parts):
        ids, mask = trajectory(parts)
        return replay(env, tok, ids, mask, eos, 400)

    answer = env_ids(env, tok, "17954")
    assert check([("Let me compute. " + call, 1), (answer, 0), ("It is 17954.", 1)]) is None
    forged = env_ids(env, tok, "17955")
    got = check([("Let me compute. " + call, 1), (forged, 0), ("It is 17955.", 1)])
    assert got is not None and got[0] == "environment", got
    no_eos = [("Let me compute. " + call, 2), (answer, 0), ("It is 17954.", 1)]  # 2: no EOS
    got = check(no_eos)
    assert got is not None and got[0] == "termination" and "end of turn" in got[1], got
    got = check([("It is 17954.", 1), (answer, 0), ("Sure.", 1)])  # no call, and it goes on
    assert got is not None and got[0] == "environment", got
    with pytest.raises(ConfigError, match="set env.syntax = 'json'"):
        ToolEnvironment(("calc",), max_turns=3, syntax="tag", tool_turns="template")
