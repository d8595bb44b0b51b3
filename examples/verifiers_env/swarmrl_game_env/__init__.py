"""A verifiers taskset with its own multi-turn environment: guess a secret number.

The model guesses; the game answers each guess with "higher", "lower" or that
it is right, as the user's next turn; the episode ends on the right guess or
after `max_guesses`. The game runs in the taskset's `Env.run`, the way
verifiers tasksets write multi-turn games (a game engine driving the player's
`interaction`), and records the reward itself: 1 for finding the number, less
a tenth for each guess after the first.

Run swarmrl with `task.name = "verifiers"`, `task.env = "swarmrl-game-env"` and
`[env] kind = "verifiers"` (docs/multi-turn.md). Config: `count` (rows),
`seed`, `high` (the secret is in 1..high) and `max_guesses`.
"""

from __future__ import annotations

import random
import re

import verifiers.v1 as vf


class GuessData(vf.TaskData):
    secret: int
    max_guesses: int


class GuessTask(vf.Task[GuessData, vf.State, vf.TaskConfig]):
    pass


class GuessConfig(vf.TasksetConfig):
    count: int = 200
    seed: int = 0
    high: int = 20
    max_guesses: int = 5


class GuessTaskset(vf.Taskset[GuessTask, GuessConfig]):
    def load(self):
        rng = random.Random(self.config.seed)
        rows = []
        for i in range(self.config.count):
            rows.append(
                GuessTask(
                    GuessData(
                        id=f"guess-{i}",
                        prompt=(
                            "Let's play a game. I picked a secret whole number from 1 to "
                            f"{self.config.high}. Reply with your guess, a single number such "
                            "as 10, and I will tell you whether my number is higher or lower."
                        ),
                        secret=rng.randint(1, self.config.high),
                        max_guesses=self.config.max_guesses,
                    ),
                    self.config.task,
                )
            )
        return rows


def last_number(text: str) -> int | None:
    found = re.findall(r"-?\d+", text)
    return int(found[-1]) if found else None


class GuessEnvConfig(vf.EnvConfig):
    player: vf.AgentConfig = vf.AgentConfig()


class GuessEnv(vf.Env[GuessEnvConfig]):
    async def run(self, task, agents):
        secret, guesses, found = task.data.secret, 0, False
        async with agents.player.interaction(task) as interaction:
            segment = await interaction.turn()
            while not segment.terminated:
                guesses += 1
                guess = last_number(segment.last_reply)
                if guess == secret:
                    found = True
                    break
                if guesses >= task.data.max_guesses:
                    break
                if guess is None:
                    hint = "Reply with a single number."
                else:
                    hint = f"{guess} is too {'low' if guess < secret else 'high'}. Guess again."
                segment = await interaction.turn(hint)
        trace = interaction.trace
        trace.record_reward("found", max(0.0, 1.0 - 0.1 * (guesses - 1)) if found else 0.0)
        trace.record_metric("guesses", guesses)


__all__ = ["GuessEnv", "GuessEnvConfig", "GuessTaskset"]
