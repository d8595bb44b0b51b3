"""The shared-prompt forward gives the packed forward's log-probs and gradients."""

from __future__ import annotations

import random

import pytest
import torch

from swarmrl.trainer.batch import Sample
from swarmrl.trainer.step import token_logprobs


@pytest.fixture(scope="module")
def model():
    from swarmrl.models.tiny import build_char_tokenizer, build_tiny_model

    m = build_tiny_model(build_char_tokenizer(), hidden=64, layers=2, seed=3)
    m.eval()
    return m


def _groups(sizes_and_lengths, vocab: int, seed: int = 0) -> list[Sample]:
    """Groups of samples sharing a prompt; prompts and completions of varied lengths."""
    rng = random.Random(seed)
    out = []
    for size, prompt_len in sizes_and_lengths:
        prompt = [rng.randrange(3, vocab) for _ in range(prompt_len)]
        for _ in range(size):
            comp = [rng.randrange(3, vocab) for _ in range(rng.randint(1, 9))]
            out.append(Sample(prompt, comp, rng.uniform(-1, 1), 0.0, 0.0, 0.0, 0))
    return out


def _grads(model, samples, share):
    model.zero_grad(set_to_none=True)
    logp, entropy, mask = token_logprobs(model, samples, 0, with_entropy=True, share=share)
    adv = torch.tensor([s.advantage for s in samples])[:, None]
    ((logp * adv + 0.1 * entropy) * mask).sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return logp.detach(), entropy.detach(), mask, grads


@pytest.mark.parametrize(
    "groups",
    [[(8, 12)], [(4, 5), (4, 17)], [(3, 9), (1, 4), (5, 9)]],
    ids=["one group", "two prompts of different lengths", "a lone sample among groups"],
)
def test_shared_prompts_match_the_packed_forward_in_log_probs_and_gradients(model, groups):
    samples = _groups(groups, model.config.vocab_size)
    lp_a, ent_a, mask_a, g_a = _grads(model, samples, share=False)
    lp_b, ent_b, mask_b, g_b = _grads(model, samples, share=True)
    assert torch.equal(mask_a, mask_b)
    assert torch.allclose(lp_a[mask_a], lp_b[mask_b], atol=1e-5)
    assert torch.allclose(ent_a[mask_a], ent_b[mask_b], atol=1e-5)
    assert g_a.keys() == g_b.keys()
    for name in g_a:
        assert torch.allclose(g_a[name], g_b[name], atol=1e-5, rtol=1e-4), name


def test_a_wrong_prompt_position_would_be_seen(model):
    """The comparison above can fail: the same completions after another prompt differ."""
    samples = _groups([(4, 10)], model.config.vocab_size)
    other = [Sample(s.prompt_tokens[1:], s.completion_tokens, 0.0, 0, 0, 0, 0) for s in samples]
    lp_a = token_logprobs(model, samples, 0, share=True)[0]
    lp_b = token_logprobs(model, other, 0, share=True)[0]
    assert not torch.allclose(lp_a, lp_b, atol=1e-3)
