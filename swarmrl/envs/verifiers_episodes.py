"""A verifiers taskset's own multi-turn environment in a trajectory (`[env] kind =
"verifiers"` with a taskset whose package exports a `vf.Env`).

verifiers writes a multi-turn game as an `Env.run(task, agents)` coroutine that
plays the model through `agents.<seat>.interaction(task)`: `await
interaction.turn()` takes the model's first reply, `await interaction.turn(text)`
sends the environment's next user turn and takes the reply to it, and a
`terminated` segment says the model has no more turns. The game's outcome is
recorded on `interaction.trace` (`record_reward`), and the task's own
`@vf.reward` functions read the trace after it.

swarmrl runs that coroutine offline with a scripted seat (`play`): its
`interaction.turn` hands back the model's replies from a list. The model's span
ends on its end-of-turn token; the environment's answer to reply k is what
`Env.run` sends to `turn` after it has been given replies 0..k, found by
running the episode from the start on those replies (`next_turn`). So an
answer is a function of the task and the replies before it: a worker and a
validator replay the same replies and get the same text, and the environment
must seed whatever it draws from the task (the probes at start refuse one that
does not: `check_deterministic`). `Env.run` returning without another turn
ends the trajectory; so does the turn limit (`env.max_turns`: the seat then
answers `terminated`, as verifiers' own limit does). The reward runs the
episode on every reply of the trajectory and sums the trace's weighted rewards
(`score`).

The environment's text reaches the model as a user turn of its chat template
(inference/trajectory.py: `user_turn`), after the model's end-of-turn token.

Runs in the taskset's checker process (tasks/graders/checker.py), bounded by
`env.tool_timeout_s` per answer; past it, or when the process dies, the
answer is `error: time limit` or `error: the tools' process died`, and a
difference there is refused as unverifiable, as for a taskset's tools
(envs/verifiers_tools.py). Refused (tasks/sources/environments.py:
`episode_problems`): an `Env` without exactly one seat, one that overrides
`setup`, `finalize`, `start` or `stop`, and one whose tasks have tools too.
"""

from __future__ import annotations

import asyncio
import copy
import functools
import json

from swarmrl.envs.verifiers_tools import DIED, TIME_LIMIT, second_checker
from swarmrl.errors import ConfigError

# replies the determinism probes play: a number, words, brackets, nothing, a long one
PROBE_REPLIES = ("7", "I guess [12].", "", "higher? 3", "x" * 300)


class _Asked(BaseException):
    """The episode wants a reply past the script: `text` is the turn it sent.
    A BaseException, so the environment's own `except Exception` does not keep it."""

    def __init__(self, text: str):
        self.text = text


class _Seat:
    """The one seat of a scripted episode: `interaction(task)` plays the replies."""

    def __init__(self, episode: _Episode):
        self.episode = episode

    def interaction(self, task):
        return _Interaction(self.episode)

    async def run(self, *args, **kwargs):
        raise TypeError(
            "agent.run() plays a whole rollout with a harness; swarmrl plays an episode "
            "turn by turn through agent.interaction(task)"
        )


class _Interaction:
    def __init__(self, episode: _Episode):
        self.episode = episode

    @property
    def trace(self):
        return self.episode.trace

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        self.episode.trace.stop("user_closed")  # as verifiers' own interaction (if not stopped)
        return False

    async def turn(self, message=None):
        return self.episode.turn(message)

    def __getattr__(self, name):
        raise AttributeError(
            f"interaction.{name} is not offered offline: an episode is played with "
            "interaction.turn() and read from interaction.trace"
        )


class _Episode:
    """One play of `Env.run` over a list of replies. `stop_at_end`: True to answer
    `terminated` when the replies run out (scoring a finished trajectory), False to
    raise `_Asked` with the turn the environment sent (the next environment span)."""

    def __init__(self, vf, task, trace, replies: list[str], max_turns: int, stop_at_end: bool):
        self.vf, self.task, self.trace = vf, task, trace
        self.replies, self.max_turns, self.stop_at_end = replies, max_turns, stop_at_end
        self.given = 0
        self.over = False
        self.asked: str | None = None  # the turn sent past the script: the answer sought

    def _add(self, message, sampled: bool = False) -> None:
        parent = len(self.trace.nodes) - 1 if self.trace.nodes else None
        self.trace.nodes.append(
            self.vf.MessageNode(parent=parent, message=message, sampled=sampled)
        )

    def turn(self, message):
        from verifiers.v1.agent import Segment

        vf = self.vf
        if self.asked is not None:  # the environment caught _Asked and went on: stop again
            raise _Asked(self.asked)
        if self.over:
            raise RuntimeError("the exchange is over (the model's turns ended)")
        if (message is None) != (self.given == 0):
            raise ValueError(
                "the task's prompt opens the exchange: the first turn() takes no message, "
                "every later one takes the environment's text"
            )
        if message is not None:
            if not isinstance(message, str):
                raise TypeError("swarmrl sends an environment's turn as text: turn(str)")
            self._add(vf.UserMessage(content=message))
        if self.given >= min(len(self.replies), self.max_turns):
            if not self.stop_at_end and self.given < self.max_turns:
                self.asked = message or ""
                raise _Asked(self.asked)
            self.over = True
            self.trace.stop("max_turns" if self.given >= self.max_turns else "length")
            return Segment(messages=[], terminated=True)
        reply = vf.AssistantMessage(content=self.replies[self.given])
        self.given += 1
        self._add(reply, sampled=True)
        return Segment(messages=[reply])


def _vf():
    import verifiers.v1 as vf

    return vf


@functools.lru_cache(maxsize=4)
def environment(env: str, args_json: str):
    """The taskset's `Env`, built once per process from the run's taskset config."""
    vf = _vf()
    config = vf.env_config_type(env).model_validate(
        {"taskset": {**json.loads(args_json), "id": env}}
    )
    return vf.load_environment(config)


def seat_name(env_class) -> str:
    """The name of the `Env`'s one seat (its one AgentConfig field)."""
    from verifiers.v1.configs.agent import AgentConfig
    from verifiers.v1.utils.generic import concrete_type

    vf = _vf()
    config = concrete_type(env_class, vf.EnvConfig, origin=vf.Env) or vf.EnvConfig
    seats = [n for n, f in config.model_fields.items() if isinstance(f.default, AgentConfig)]
    return seats[0] if len(seats) == 1 else ""


def play(env, task, new_trace, replies: list[str], max_turns: int, stop_at_end: bool):
    """Run the episode of `task` (a verifiers Task) with `env` (the taskset's `Env`,
    `environment`) on `replies`: (the turn the environment sent after the last reply,
    or None when the episode ended there; the trace, from `new_trace(task)` holding
    the prompt). Each play gets a copy of the task and of the environment object (what
    `run` sets on either is gone after it), and an event loop of its own, shut down
    with its tasks, generators and threads before the next play."""
    vf = _vf()
    env = copy.copy(env)
    task = copy.deepcopy(task)
    trace = new_trace(task)
    episode = _Episode(vf, task, trace, list(replies), max_turns, stop_at_end)
    seat = seat_name(type(env))

    class Seats:
        def __getattr__(self, name):
            if name != seat:
                raise AttributeError(f"the environment has no seat {name!r}")
            return _Seat(episode)

    try:
        _run(env.run(task, Seats()))
    except BaseException:
        if episode.asked is None:  # a failure of the environment's own
            raise
    # an ask is the answer, however the environment ended after it (a finally that
    # sends another turn, an except that swallows it, a task group that wraps it)
    return episode.asked, trace


def _run(coroutine) -> None:
    """`coroutine` on a fresh event loop, left with nothing running."""
    loop = asyncio.new_event_loop()
    try:
        loop.run_until_complete(coroutine)
    finally:
        try:
            pending = asyncio.all_tasks(loop)
            for task in pending:
                task.cancel()
            if pending:  # (gather of nothing would take another loop)
                loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.run_until_complete(loop.shutdown_default_executor())
        finally:
            loop.close()


def next_turn(env, task, new_trace, replies: list[str], max_turns: int) -> str | list:
    """The environment's turn after the last of `replies` (`play`'s arguments); ["end"]
    when the episode ends there, ["error", type] when the episode raised (it ends, and
    scores 0)."""
    try:
        got, _ = play(env, task, new_trace, replies, max_turns, stop_at_end=False)
    except KeyboardInterrupt:
        raise
    except BaseException as e:  # recovered: the environment's failure ends the episode
        return ["error", f"{type(e).__name__}: {str(e)[:300]}"]
    return ["end"] if got is None else got


def score(env, task, new_trace, replies: list[str], max_turns: int) -> float:
    """The trajectory's reward: the episode played on every reply (a turn asked for
    after the last one ends the exchange: `max_turns`, else the token budget), then the
    task's own rewards on its trace; the weighted sum (0 when the episode or a reward
    fails)."""
    try:
        turns = max(max_turns, len(replies))
        _, trace = play(env, task, new_trace, replies, turns, stop_at_end=True)
        _run(copy.deepcopy(task).score(trace))
    except KeyboardInterrupt:
        raise
    except BaseException:  # recovered: a failing episode or reward grades it 0
        return 0.0
    if any(r is None for r in trace.rewards.values()):
        return 0.0
    reward = float(trace.reward)
    return reward if reward == reward and abs(reward) != float("inf") else 0.0


# ---- in a worker or a validator: the episodes run in the checker process ----


class EpisodeEnvironment:
    """`[env] kind = "verifiers"` with a taskset's own `Env`; `bind(task)` gives the
    environment of one trajectory of that task. `turn_role`: the model's span ends
    on its end-of-turn token, and the environment's text is a user turn."""

    turn_role = "user"

    def __init__(self, max_turns: int, timeout_s: float, checker=None):
        from swarmrl.tasks.graders.checker import CheckerProcess

        self.max_turns = max_turns
        self.checker = checker or CheckerProcess("swarmrl.tasks.sources.environments", timeout_s)
        self.second: CheckerProcess | None = None  # a second opinion (`BoundEpisode.doubt`)

    def ends(self, model_span: str) -> bool:
        return False  # only the end-of-turn token ends a span

    def second_checker(self):
        return second_checker(self)

    def bind(self, task) -> BoundEpisode:
        info = task.verification_info
        self.checker.warm(["load", info["env"], info["args"]])  # loading is not a turn's time
        return BoundEpisode(self, info)

    def turn_after(self, info: dict, replies: list[str], checker=None) -> str | list:
        """`next_turn` in the checker (or `checker`), or TIME_LIMIT / DIED when it gave
        no answer."""
        checker = checker or self.checker
        got = checker.call(["episode", info, replies, self.max_turns])
        if got is None:
            return DIED if checker.crashed else TIME_LIMIT
        if not (
            isinstance(got, str) or isinstance(got, list) and got and got[0] in ("end", "error")
        ):
            return DIED  # not an answer of ours: the child is not to be trusted
        return got


class BoundEpisode:
    """One trajectory's episode: answers a reply from the replies before it."""

    turn_role = "user"

    def __init__(self, env: EpisodeEnvironment, info: dict):
        self.env, self.info = env, info
        self.replies: list[str] = []  # the model's reply of each turn so far
        self.failed: dict[int, str] = {}  # turns the checker gave no answer to, and why

    def ends(self, model_span: str) -> bool:
        return False

    failure_answers = (TIME_LIMIT, DIED)  # a file's turn is read as one only token for token

    def respond(self, model_span: str, turn: int) -> str | None:
        """The environment's user turn after model span `turn` (0-based), or None when
        the episode ends there (the environment ends it, or the turn limit)."""
        if turn + 1 >= self.env.max_turns:
            return None
        self.replies = self.replies[:turn] + [model_span]
        got = self.env.turn_after(self.info, self.replies)
        self.failed.pop(turn, None)
        if got in (TIME_LIMIT, DIED):
            self.failed[turn] = got
        return got if isinstance(got, str) else None

    def doubt(self, model_span: str, turn: int, answer: str, claimed: str) -> str | None:
        """Why the file's turn `claimed` may differ from `answer` through no fault of the
        worker: the episode ran out of time or its process died, here or on the worker
        (its turn is exactly that answer), or it answers differently in another process."""
        if turn in self.failed or claimed in self.failure_answers:
            return "the episode ran out of time or its process died (on the worker or here)"
        again = self.env.turn_after(
            self.info, [*self.replies[:turn], model_span], self.env.second_checker()
        )
        if (again if isinstance(again, str) else None) != answer:
            return "the episode answers differently on a second run"
        return None


def check_deterministic(env: EpisodeEnvironment, info: dict) -> None:
    """Refuse an episode whose turns after the same replies differ: each prefix of the
    probe replies played twice in one checker process and once in a fresh one. An
    episode that raises on them is refused with its error."""
    runs: list[list] = [[], [], []]
    for k in range(3):
        if k == 2:
            env.checker.close()
        for n in range(1, min(len(PROBE_REPLIES), env.max_turns - 1) + 1):
            runs[k].append(env.turn_after(info, list(PROBE_REPLIES[:n])))
    for got in runs[0]:
        if got in (TIME_LIMIT, DIED):
            raise ConfigError(
                f"the taskset's environment gave no turn after the probe replies ({got}; "
                f"env.tool_timeout_s is {env.checker.timeout_s} s)"
            )
        if isinstance(got, list) and got[0] == "error":
            raise ConfigError(f"the taskset's environment fails on the probe replies: {got[1]}")
    for n, answers in enumerate(zip(*runs, strict=True), start=1):
        if len({json.dumps(a) for a in answers}) > 1:
            where = "in one process" if answers[0] != answers[1] else "in a fresh process"
            raise ConfigError(
                f"the taskset's environment is not deterministic: after the replies "
                f"{list(PROBE_REPLIES[:n])} it said {answers[0]!r} and then "
                f"{answers[1] if answers[0] != answers[1] else answers[2]!r} {where}; seed "
                "what it draws from the task, or a validator cannot recompute its turns"
            )
