"""Deterministic test environments of multi-turn trajectories, for tests and benches
where the tiny model would never write a real tool call.

- `Echo` ends a model span after three characters (a call rule cut inside a span)
  and answers them reversed, in brackets;
- `Nag` answers each model turn, which ends on end of sequence, with a user turn of
  the chat template (`turn_role`), "more" and the turn's number, until the third.
"""

from __future__ import annotations


class Echo:
    """Ends a span after three characters and answers them reversed, in brackets."""

    max_turns = 3

    def ends(self, span: str) -> bool:
        return len(span) >= 3

    def respond(self, span: str, turn: int) -> str | None:
        if turn + 1 >= self.max_turns or not self.ends(span):
            return None
        return f"[{span[::-1]}]"


class Nag:
    """Answers each of the model's turns (they end on its end of sequence) with a user
    turn, "more" and the turn's number, until the third."""

    turn_role = "user"
    max_turns = 3

    def ends(self, span: str) -> bool:
        return False

    def respond(self, span: str, turn: int) -> str | None:
        return None if turn + 1 >= self.max_turns else f"more {turn}"
