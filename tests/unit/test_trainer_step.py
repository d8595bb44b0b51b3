"""The shared-prompt forward gives the packed forward's log-probs and gradients."""

from __future__ import annotations

import random

import pytest
import torch

from swarmrl.trainer.batch import Sample
from swarmrl.trainer.step import token_logprobs


@pytest.fixture(scope="module", params=["tiny", "grouped-query"])
def model(request):
    """The project's tiny Llama, and one with grouped-query attention as SmolLM2 has."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from swarmrl.models.tiny import build_char_tokenizer, build_tiny_model

    torch.manual_seed(3)
    if request.param == "tiny":
        m = build_tiny_model(build_char_tokenizer(), hidden=64, layers=2, seed=3)
    else:
        cfg = LlamaConfig(
            vocab_size=80, hidden_size=48, intermediate_size=96, num_hidden_layers=2,
            num_attention_heads=6, num_key_value_heads=2, tie_word_embeddings=True,
        )  # fmt: skip
        m = LlamaForCausalLM(cfg)
    m.eval()
    return m


def _groups(sizes_and_lengths, vocab: int, seed: int = 0, longest: int = 9) -> list[Sample]:
    """Groups of samples sharing a prompt; prompts and completions of varied lengths."""
    rng = random.Random(seed)
    out = []
    for size, prompt_len in sizes_and_lengths:
        prompt = [rng.randrange(3, vocab) for _ in range(prompt_len)]
        for _ in range(size):
            comp = [rng.randrange(3, vocab) for _ in range(rng.randint(1, longest))]
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
    "groups, longest",
    [([(8, 12)], 9), ([(4, 5), (4, 17)], 9), ([(3, 9), (1, 4), (5, 9)], 9), ([(4, 7)], 1)],
    ids=["one group", "two prompt lengths", "a lone sample among groups", "one-token answers"],
)
def test_shared_prompts_match_the_packed_forward_in_log_probs_and_gradients(model, groups, longest):
    samples = _groups(groups, model.config.vocab_size, longest=longest)
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


def test_a_grpo_update_is_the_same_with_shared_prompts(model):
    """Whole updates, micro-batches splitting groups, from the same weights."""
    import copy

    from swarmrl.config import TrainerConfig
    from swarmrl.trainer.step import grpo_update

    samples = _groups([(4, 6), (4, 11), (4, 8)], model.config.vocab_size, seed=5)
    out = {}
    for share in (False, True):
        m = copy.deepcopy(model)
        cfg = TrainerConfig(micro_batch=5, optimizer_steps=2, share_prompts=share)
        opt = torch.optim.SGD(m.parameters(), lr=0.1)  # Adam would magnify float noise in ~0 grads
        stats = grpo_update(m, None, opt, samples, cfg, 200.0, 0)
        out[share] = (stats, torch.cat([p.detach().flatten() for p in m.parameters()]))
    (a, wa), (b, wb) = out[False], out[True]
    assert a.tokens == b.tokens
    assert a.loss == pytest.approx(b.loss, abs=1e-5)
    assert a.grad_norm == pytest.approx(b.grad_norm, rel=1e-4)
    assert torch.allclose(wa, wb, atol=1e-6)
    assert not torch.allclose(wa, torch.cat([p.flatten() for p in model.parameters()]))


def test_models_the_shared_forward_would_get_wrong_take_the_packed_path():
    from transformers import MistralConfig, MistralForCausalLM

    from swarmrl.trainer.step import can_share_prompts

    small = dict(vocab_size=40, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                 num_attention_heads=4, num_key_value_heads=2)  # fmt: skip
    assert not can_share_prompts(MistralForCausalLM(MistralConfig(**small, sliding_window=8)))
    assert can_share_prompts(MistralForCausalLM(MistralConfig(**small, sliding_window=None)))
