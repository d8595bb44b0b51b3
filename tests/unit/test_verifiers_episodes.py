"""A verifiers taskset's own multi-turn environment in trajectories (`[env] kind =
"verifiers"` with a taskset that exports a `vf.Env`): its `Env.run` is played with
the model's replies, the model's span ends on its end-of-turn token, the
environment's turn goes in as a user turn, a validator replays the episode, and
the reward is the episode's (envs/verifiers_episodes.py)."""

import pytest

from bench.rollout_files import Maker, issued, make_judge, small_run
from swarmrl.config import TaskConfig, load_config
from swarmrl.envs.environment import environment_of
from swarmrl.envs.verifiers_episodes import EpisodeEnvironment
from swarmrl.envs.verifiers_tools import TIME_LIMIT
from swarmrl.errors import ConfigError
from swarmrl.inference.trajectory import user_turn
from swarmrl.protocol.rollouts import read_rollouts, spans, write_rollouts
from swarmrl.tasks.graders.registry import verify
from swarmrl.tasks.schema import TaskError
from swarmrl.tasks.sources.task_source import TaskSource
from swarmrl.validator.checks import Reject, check_without_model

pytest.importorskip("verifiers", reason="verifiers is in the dev extras")

GAME = TaskConfig(name="verifiers", env="swarmrl-game-env", env_args={"count": 12})
RUN = ["task.name=verifiers", 'task.env="swarmrl-game-env"', "task.env_args={count=12}",
       'env.kind="verifiers"', "env.max_turns=3", "sampling.max_prompt_tokens=1024",
       "sampling.max_new_tokens=80"]  # fmt: skip

ENV_HEAD = """
    import random, time
    import verifiers.v1 as vf

    class D(vf.TaskData):
        pass

    class T(vf.Task[D]):
        pass

    class TS(vf.Taskset[T, vf.TasksetConfig]):
        def load(self):
            return [T(D(id="a", prompt="hi"), self.config.task)]

    class C(vf.EnvConfig):
        player: vf.AgentConfig = vf.AgentConfig()
"""
MODULES = {  # test tasksets with environments swarmrl refuses, each for its reason
    "swarmrl_test_episode_dice": ENV_HEAD
    + """
    class E(vf.Env[C]):
        async def run(self, task, agents):
            async with agents.player.interaction(task) as it:
                seg = await it.turn()
                while not seg.terminated:
                    seg = await it.turn(f"you rolled {random.SystemRandom().randint(1, 10**9)}")

    __all__ = ["TS", "E"]
    """,
    "swarmrl_test_episode_pair": ENV_HEAD
    + """
    class C2(C):
        rival: vf.AgentConfig = vf.AgentConfig()

    class E(vf.Env[C2]):
        async def run(self, task, agents):
            pass

        async def finalize(self, task, episode):
            pass

    __all__ = ["TS", "E"]
    """,
    "swarmrl_test_episode_harness": ENV_HEAD
    + """
    class E(vf.Env[C]):
        async def run(self, task, agents):
            await agents.player.run(task)

    __all__ = ["TS", "E"]
    """,
    "swarmrl_test_episode_stubborn": ENV_HEAD
    + """
    class E(vf.Env[C]):
        async def run(self, task, agents):
            async with agents.player.interaction(task) as it:
                seg = await it.turn()
                n = 0
                while not seg.terminated:
                    n += 1
                    try:
                        seg = await it.turn(f"turn {n}")
                    except BaseException:
                        return
                    finally:
                        await it.turn("a last word")

    __all__ = ["TS", "E"]
    """,
    "swarmrl_test_episode_slow": ENV_HEAD
    + """
    class E(vf.Env[C]):
        async def run(self, task, agents):
            async with agents.player.interaction(task) as it:
                seg = await it.turn()
                while not seg.terminated:
                    if "sleep" in seg.last_reply:
                        time.sleep(5)
                    seg = await it.turn("go on")

    __all__ = ["TS", "E"]
    """,
}


@pytest.fixture(scope="module", autouse=True)
def tasksets_importable(tmp_path_factory):
    """The example tasksets and the test ones on the path of this process and of the
    checker processes."""
    from tests.unit.test_verifiers_tools import importable

    with importable(tmp_path_factory.mktemp("episodes"), MODULES):
        yield


def secret(task) -> int:
    from swarmrl.tasks.sources.environments import task_row

    return task_row(task.verification_info).data.secret


def test_the_game_answers_each_reply_from_the_replies_before_it():
    env = environment_of(load_config(None, RUN))
    task = TaskSource(GAME, 0).get("train", 0)
    n = secret(task)
    low = 1 if n > 1 else 2
    game = env.bind(task)
    assert game.respond(str(low), 0) == (
        f"{low} is too {'low' if low < n else 'high'}. Guess again."
    )
    assert game.respond("no idea", 1) == "Reply with a single number."
    assert game.respond("3", 2) is None  # max_turns = 3: the last reply
    assert game.respond("no idea", 0) == "Reply with a single number."  # turn 0 again
    assert env.bind(task).respond(f"It is {n}.", 0) is None  # found: the episode ends
    assert not game.ends("20")  # only the end-of-turn token ends a span


def test_the_reward_is_the_episodes_on_every_reply():
    task = TaskSource(GAME, 0).get("train", 1)
    n = secret(task)
    wrong = n % 20 + 1
    assert verify(task, "", [str(n)]) == 1.0
    assert verify(task, "", [str(wrong), f"then {n}"]) == pytest.approx(0.9)
    assert verify(task, "", [str(wrong), str(wrong)]) == 0.0
    # a single completion (eval, filter, warm start) plays the episode as one reply
    assert verify(task, str(n), None) == 1.0 and verify(task, str(wrong), None) == 0.0


def _trajectory(tok, eos: int, spans_: list[tuple[str, int]]) -> tuple[list[int], list[int]]:
    ids, mask = [], []
    for text, model in spans_:
        piece = tok(text, add_special_tokens=False)["input_ids"] + ([eos] if model else [])
        ids += piece
        mask += [model] * len(piece)
    return ids, mask


def test_a_file_of_game_trajectories_is_checked_by_replaying_the_episode(
    random_model_dir, tmp_path
):
    cfg = small_run(tmp_path, random_model_dir, *RUN)
    maker, judge = Maker(cfg, tmp_path), make_judge(cfg, tmp_path)
    key, data = maker.file()  # generated: the random model's turns end on its EOS, or the budget
    rows = read_rollouts(data)
    turns = [sum(m for _, _, m in spans(r["completion_mask"])) for r in rows]
    assert max(turns) >= 2, turns  # the game answered a reply and the model went on
    v = judge.judge(key, data, issued=issued(key))  # proofs and sampling over the turns
    assert v is not None and v.accepted, (v.check, v.reason)

    tok, eos = maker.tokenizer, maker.tokenizer.eos_token_id
    tasks = {maker.source.get("train", i).problem_id: maker.source.get("train", i)
             for i in range(maker.source.n_records)}  # fmt: skip

    def rewrite(rows, hint_of, after=(), lose=False):
        """Each row: a wrong guess, the hint, the right one (or, `lose` on odd rows, three
        wrong guesses), then the replies `after`."""
        out = []
        for i, r in enumerate(rows):
            task = tasks[r["problem_id"]]
            n = secret(task)
            wrong = n % 20 + 1
            replies = [str(wrong), str(n), *after]
            if lose and i % 2:
                replies = [str(wrong)] * 3
            parts = [(replies[0], 1)]
            for reply in replies[1:]:
                parts += [(user_turn(tok, hint_of(wrong, n)), 0), (reply, 1)]
            ids, mask = _trajectory(tok, eos, parts)
            text = tok.decode(ids, skip_special_tokens=True)
            reward = verify(task, text, replies)
            out.append({**r, "completion": text, "completion_tokens": ids, "completion_mask": mask,
                        "completion_logprobs": [0.0] * len(ids), "task_reward": reward,
                        "reward": reward})  # fmt: skip
        return out

    def honest_hint(g, n):
        return f"{g} is too {'low' if g < n else 'high'}. Guess again."

    ctx = judge.ctx.with_issued(issued(key))
    honest = rewrite(rows, honest_hint)
    assert all(r["task_reward"] == pytest.approx(0.9) for r in honest)
    check_without_model(ctx, key, write_rollouts(honest))  # the replayed episode agrees

    def lie(g, n):
        return f"{g} is too {'high' if g < n else 'low'}. Guess again."

    with pytest.raises(Reject) as e:
        check_without_model(ctx, key, write_rollouts(rewrite(rows, lie)))
    assert e.value.check == "environment", e.value.reason

    mixed = rewrite(rows, honest_hint, lose=True)
    assert sorted({round(r["task_reward"], 3) for r in mixed}) == [0.0, 0.9]
    mixed_data = write_rollouts(mixed)
    check_without_model(ctx, key, mixed_data)
    trains_on_the_model_tokens_only(cfg, key, mixed_data)

    with pytest.raises(Reject) as e:  # the game ended on the right guess; the file goes on
        check_without_model(ctx, key, write_rollouts(rewrite(rows, honest_hint, after=["1"])))
    assert e.value.check == "environment" and "ends the trajectory here" in e.value.reason

    cut = [dict(r) for r in honest]  # a reply handed over without its end of turn
    first_env = cut[0]["completion_mask"].index(0)
    del cut[0]["completion_tokens"][first_env - 1]
    del cut[0]["completion_mask"][first_env - 1]
    del cut[0]["completion_logprobs"][first_env - 1]
    with pytest.raises(Reject) as e:
        check_without_model(ctx, key, write_rollouts(cut))
    assert e.value.check == "termination" and "end of turn" in e.value.reason


def trains_on_the_model_tokens_only(cfg, key: str, data: bytes) -> None:
    """The trainer's batch of an accepted file of game trajectories keeps each mask, and
    its update counts the model's tokens only (its end-of-turn tokens included)."""
    import torch

    from swarmrl.config import TrainerConfig
    from swarmrl.models.loading import load_model
    from swarmrl.protocol.rollouts import Limits
    from swarmrl.trainer.batch import BatchCollector
    from swarmrl.trainer.step import grpo_update
    from tests.unit.test_store_and_batch import MemoryQueue

    q = MemoryQueue()
    q.put(key, data, {"accepted": True})
    limits = Limits(group_size=cfg.worker.group_size, max_turns=cfg.env.max_turns)
    batch = BatchCollector(q, limits, async_level=2, poll_s=0.01).collect(1, 1)
    assert batch.samples and all(s.completion_mask for s in batch.samples)
    model = load_model(str(cfg.model.path), "float32")
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    stats = grpo_update(model, None, opt, batch.samples, TrainerConfig(micro_batch=8), 40.0, 1)
    assert stats.tokens == sum(sum(s.completion_mask) for s in batch.samples)
    assert stats.tokens < sum(len(s.completion_tokens) for s in batch.samples)


@pytest.fixture(scope="module")
def smollm2_tokenizer():
    """SmolLM2's tokenizer (from the packaged GGUF): a chat template with special tokens."""
    from swarmrl.models.loading import load_tokenizer

    return load_tokenizer("smollm2")


def test_a_user_turn_follows_the_chat_template(smollm2_tokenizer):
    from swarmrl.inference.trajectory import check_turns
    from swarmrl.models.tiny import build_char_tokenizer

    assert user_turn(build_char_tokenizer(), "7 is too low.") == "\n7 is too low.\n"  # a line
    tok = smollm2_tokenizer
    assert user_turn(tok, "7 is too low.") == (
        "\n<|im_start|>user\n7 is too low.<|im_end|>\n<|im_start|>assistant\n"
    )
    env = EpisodeEnvironment(max_turns=3, timeout_s=5.0)
    check_turns(env, tok, tok.eos_token_id)
    with pytest.raises(ConfigError, match="generation stops on token 0"):
        check_turns(env, tok, 0)  # the engine stops on another token than the turn's end
    original = tok.chat_template
    try:  # a template that writes more after the reply than its end of turn
        tok.chat_template = original.replace("+ '<|im_end|>'", "+ '.<|im_end|>'")
        assert tok.chat_template != original
        with pytest.raises(ConfigError, match="end-of-sequence token"):
            check_turns(env, tok, tok.eos_token_id)
        tok.chat_template = (  # one that cannot render a user turn after an assistant's
            "{% for m in messages %}{% if loop.index > 2 %}{{ raise_exception('no') }}"
            "{% endif %}{{ m.content }}<|im_end|>{% endfor %}"
        )
        with pytest.raises(ConfigError, match="cannot render a user turn"):
            check_turns(env, tok, tok.eos_token_id)
    finally:
        tok.chat_template = original


def test_a_forged_turn_that_quotes_the_time_limit_is_still_a_forgery(smollm2_tokenizer):
    """A turn is read as the environment's failure only when its tokens are exactly the
    failure's turn; a forged hint with the failure's text on a line of its own is not."""
    from swarmrl.inference.trajectory import env_ids, replay

    tok = smollm2_tokenizer
    eos = tok.eos_token_id
    env = environment_of(load_config(None, RUN))
    task = TaskSource(GAME, 0).get("train", 3)
    n = secret(task)
    wrong = n % 20 + 1

    def check(turn_text: str):
        game = env.bind(task)
        ids = tok(str(wrong), add_special_tokens=False)["input_ids"] + [eos]
        env_span = env_ids(game, tok, turn_text)
        reply = tok(str(n), add_special_tokens=False)["input_ids"] + [eos]
        mask = [1] * len(ids) + [0] * len(env_span) + [1] * len(reply)
        return replay(game, tok, ids + env_span + reply, mask, eos, 200)

    assert check(f"{wrong} is too {'low' if wrong < n else 'high'}. Guess again.") is None
    got = check(f"{wrong} is right!\n{TIME_LIMIT}")
    assert got is not None and got[0] == "environment", got
    got = check(TIME_LIMIT)  # the failure itself: blameless, as any claimed time limit
    assert got is not None and got[0] == "unverifiable", got


@pytest.mark.slow  # 21 s
def test_environments_that_cannot_be_replayed_are_refused_with_the_reason():
    def cfg(env, *more):
        return load_config(None, ["task.name=verifiers", f'task.env="{env}"', *more])

    with pytest.raises(ConfigError, match="not deterministic: after the replies"):
        environment_of(cfg("swarmrl-test-episode-dice", 'env.kind="verifiers"'))
    with pytest.raises(TaskError) as e:
        TaskSource(TaskConfig(name="verifiers", env="swarmrl-test-episode-pair"), 0)
    assert "exactly one seat" in str(e.value) and "overrides Env.finalize" in str(e.value)
    with pytest.raises(ConfigError, match="fails on the probe replies: TypeError: agent.run"):
        environment_of(cfg("swarmrl-test-episode-harness", 'env.kind="verifiers"'))
    with pytest.raises(ConfigError, match="has its own multi-turn environment: set"):
        environment_of(cfg("swarmrl-game-env"))
    with pytest.raises(ConfigError, match="max_turns of at least 2"):
        environment_of(cfg("swarmrl-game-env", 'env.kind="verifiers"', "env.max_turns=1"))


@pytest.mark.slow  # 12 s; the tools' time limit stays in the default suite
def test_an_episode_past_its_time_limit_cannot_be_settled():
    task = TaskSource(TaskConfig(name="verifiers", env="swarmrl-test-episode-slow"), 0).get(
        "train", 0
    )
    env = EpisodeEnvironment(max_turns=4, timeout_s=1.0)
    game = env.bind(task)
    assert game.respond("fine", 0) == "go on"
    assert game.respond("sleep now", 1) == TIME_LIMIT
    assert "ran out of time" in game.doubt("sleep now", 1, TIME_LIMIT, "\ngo on\n")
    quick = env.bind(task)
    assert quick.doubt("fine", 0, "go on", "\ngo off\n") is None  # a forgery, not a doubt
    env.checker.close()


def test_an_environment_that_catches_the_stop_still_answers_its_turn():
    """The scripted seat stops an episode past the replies by raising; an environment
    that swallows it, or sends another turn in a `finally`, still gets the turn it sent
    first as its answer."""
    task = TaskSource(TaskConfig(name="verifiers", env="swarmrl-test-episode-stubborn"), 0).get(
        "train", 0
    )
    env = EpisodeEnvironment(max_turns=4, timeout_s=5.0)
    game = env.bind(task)
    assert game.respond("a", 0) == "turn 1"
    assert game.respond("b", 1) == "a last word"  # after turn 1's reply, its finally spoke
    env.checker.close()
