"""The text the `swarmrl diloco` run trains on, generated from a seed.

Nothing can be downloaded here, so the corpus is made by a small grammar:
sentences about people, animals and places, and spelled-out sums ("two plus
three is five."). It has structure a tiny character model learns in minutes
(agreement, the words themselves, the sums), and every machine makes the same
lines from the same seed. Site k of n trains on lines k, k + n, k + 2n, ...;
the held-out lines come from another seed.
"""

from __future__ import annotations

import random

import torch

NUMBERS = "zero one two three four five six seven eight nine ten".split()
SUBJECTS = [
    ("the cat", "s"), ("a dog", "s"), ("my friend", "s"), ("the old man", "s"),
    ("two birds", ""), ("the children", ""), ("a farmer", "s"), ("her sisters", ""),
]  # fmt: skip
VERBS = ["see", "like", "follow", "paint", "visit", "call", "help", "watch"]
OBJECTS = [
    "the river", "a small house", "the red car", "an apple tree", "the market",
    "a quiet town", "the blue sea", "our garden",
]  # fmt: skip
TIMES = ["today", "every morning", "at night", "in the spring", "after lunch"]


def _line(rng: random.Random) -> str:
    if rng.random() < 0.3:
        a, b = rng.randrange(6), rng.randrange(5)
        return f"{NUMBERS[a]} plus {NUMBERS[b]} is {NUMBERS[a + b]}."
    subject, ending = rng.choice(SUBJECTS)
    return f"{subject} {rng.choice(VERBS)}{ending} {rng.choice(OBJECTS)} {rng.choice(TIMES)}."


def corpus_lines(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [_line(rng) for _ in range(n)]


class Shard:
    """One site's lines as a token stream, sampled in windows of seq_len + 1."""

    def __init__(self, tokenizer, lines: list[str], seq_len: int):
        ids = tokenizer("\n".join(lines), add_special_tokens=False)["input_ids"]
        self.tokens = torch.tensor(ids, dtype=torch.long)
        self.seq_len = seq_len
        if self.tokens.numel() <= seq_len + 1:
            raise ValueError(f"a shard of {self.tokens.numel()} tokens is too short for seq_len")

    def batch(self, gen: torch.Generator, size: int) -> torch.Tensor:
        starts = torch.randint(0, self.tokens.numel() - self.seq_len - 1, (size,), generator=gen)
        return torch.stack([self.tokens[s : s + self.seq_len + 1] for s in starts.tolist()])

    def eval_batches(self, size: int) -> list[torch.Tensor]:
        """Consecutive windows covering the stream once (the same on every site)."""
        n = (self.tokens.numel() - 1) // self.seq_len
        rows = [
            self.tokens[i * self.seq_len : i * self.seq_len + self.seq_len + 1] for i in range(n)
        ]
        return [torch.stack(rows[i : i + size]) for i in range(0, n, size)]


def site_shard(tokenizer, lines: int, seed: int, site: int, shards: int, seq_len: int) -> Shard:
    return Shard(tokenizer, corpus_lines(lines, seed)[site::shards], seq_len)


def held_out(tokenizer, lines: int, seed: int, seq_len: int) -> Shard:
    return Shard(tokenizer, corpus_lines(lines, seed + 1_000_003), seq_len)
