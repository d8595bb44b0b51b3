"""Multi-turn trajectories from the transformers engine (issue 26, second part): with an
environment that never answers they are the single-turn completions exactly; with one
that answers, the validator's one prefill over the whole completion checks the model's
tokens (proofs at every position, the seeded choice at the model's positions), and the
environment's spans are what the environment answers."""

from __future__ import annotations

import torch

from swarmrl.inference.hf import HFBackend
from swarmrl.inference.trajectory import generate_trajectories
from swarmrl.models.loading import load_tokenizer
from swarmrl.toploc.proof import check_proofs_many
from swarmrl.toploc.sampling import check_sampling


class Silent:
    def ends(self, span: str) -> bool:
        return False

    def respond(self, span: str, turn: int) -> str | None:
        return None


class Echo:
    """Ends a span after three characters and answers with them reversed, twice."""

    def ends(self, span: str) -> bool:
        return len(span) >= 3

    def respond(self, span: str, turn: int) -> str | None:
        return None if turn >= 2 else f"[{span[::-1]}]"


def _setup(random_model_dir):
    tok = load_tokenizer(str(random_model_dir))
    be = HFBackend(max_batch=8)
    be.load(random_model_dir)
    prompts = [tok(f"abc{x}\n", add_special_tokens=False)["input_ids"] for x in "defgh"]
    return tok, be, prompts, [11, 12, 13, 14, 15]


def test_with_no_environment_turns_a_trajectory_is_the_single_turn_completion(random_model_dir):
    tok, be, prompts, seeds = _setup(random_model_dir)
    single = be.generate(prompts, seeds, 12, 1.0, 1.0)
    multi = generate_trajectories(be, tok, Silent(), prompts, seeds, 12, 1.0, 1.0)
    for s, m in zip(single, multi, strict=True):
        assert m.tokens == s.tokens and m.mask == [1] * len(s.tokens)
        assert m.logprobs == s.logprobs and m.proofs == s.proofs and m.finished == s.finished


def test_the_validators_one_prefill_checks_every_turn(random_model_dir):
    tok, be, prompts, seeds = _setup(random_model_dir)
    env = Echo()
    trajs = generate_trajectories(be, tok, env, prompts, seeds, 24, 1.0, 1.0)
    assert any(len(t.spans()) >= 3 for t in trajs), [t.spans() for t in trajs]
    checked = be.prefill(prompts, [t.tokens for t in trajs])
    for t, (hidden, logits) in zip(trajs, checked, strict=True):
        # the proofs cover every position, the environment's too
        assert all(c.accepted for c in check_proofs_many([t.proofs], [hidden])[0])
        # the model's tokens are the seeded choices at their places in the completion
        at = torch.tensor([i for i, m in enumerate(t.mask) if m])
        res = check_sampling(logits[at], torch.tensor(t.tokens)[at], seeds[trajs.index(t)],
                             1.0, 1.0, positions=at)  # fmt: skip
        assert res.failures == 0, res
        # each environment span is the environment's answer to the model span before it
        spans = t.spans()
        for turn, (_kind, a, b) in enumerate(x for x in spans if x[0] == 0):
            before = next(s for s in reversed(spans) if s[0] == 1 and s[2] == a)
            said = tok.decode(t.tokens[before[1] : before[2]], skip_special_tokens=True)
            assert tok.decode(t.tokens[a:b]) == env.respond(said, turn)
            assert all(lp == 0.0 for lp in t.logprobs[a:b])
    # a token the model did not choose fails at its own position (and counting positions
    # from the start of its span instead of the completion's fails too)
    t = next(t for t in trajs if len(t.spans()) >= 3)
    i = trajs.index(t)
    hidden, logits = checked[i]
    at = torch.tensor([j for j, m in enumerate(t.mask) if m])
    wrong = torch.arange(len(at))
    res = check_sampling(logits[at], torch.tensor(t.tokens)[at], seeds[i], 1.0, 1.0,
                         positions=wrong)  # fmt: skip
    assert res.failures > 0


def test_an_edited_environment_span_breaks_the_proofs(random_model_dir):
    """A worker that writes another tool result than the one its model read: the states
    its proofs commit to are not the validator's over the file's tokens."""
    tok, be, prompts, seeds = _setup(random_model_dir)
    trajs = generate_trajectories(be, tok, Echo(), prompts, seeds, 24, 1.0, 1.0)
    edited = []
    for t in trajs:
        env = [(a, b) for kind, a, b in t.spans() if kind == 0]
        if env:
            tokens = list(t.tokens)
            a, b = env[0]
            tokens[a:b] = tok(f"[{'z' * (b - a - 2)}]", add_special_tokens=False)["input_ids"]
            assert tokens != t.tokens
            edited.append((t, tokens))
    assert edited
    checked = be.prefill([prompts[trajs.index(t)] for t, _ in edited], [x for _, x in edited])
    for (t, _), (hidden, _logits) in zip(edited, checked, strict=True):
        assert not all(c.accepted for c in check_proofs_many([t.proofs], [hidden])[0])
