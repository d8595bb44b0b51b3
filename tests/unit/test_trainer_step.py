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


def test_environment_tokens_are_context_and_not_trained_on(model):
    """A trajectory's environment tokens (mask 0): the mask the loss sees is the
    model's tokens; the update counts only those, and is the same whatever the log-probs
    recorded at the environment's positions (an importance weight or a mismatch figure
    there would move it); with every token called the model's it differs."""
    import copy
    from dataclasses import replace

    from swarmrl.config import TrainerConfig
    from swarmrl.trainer.step import grpo_update

    rng = random.Random(7)
    base = _groups([(4, 6)], model.config.vocab_size, seed=7, longest=4)
    samples = []
    for s in base:  # model span, two environment tokens, model span
        tail = [rng.randrange(3, model.config.vocab_size) for _ in range(3)]
        comp = s.completion_tokens + [5, 6] + tail
        mask = [1] * len(s.completion_tokens) + [0, 0] + [1, 1, 1]
        behav = [-1.0 if m else 0.0 for m in mask]
        samples.append(replace(s, completion_tokens=comp, completion_mask=mask,
                               behav_logprobs=behav))  # fmt: skip
    _, _, mask = token_logprobs(model, samples, 0, share=False)
    for i, s in enumerate(samples):
        n = len(s.completion_tokens)
        assert mask[i, :n].tolist() == [bool(m) for m in s.completion_mask]
        assert not mask[i, n:].any()
    forged = [
        replace(s, behav_logprobs=[b if m else -30.0 for b, m in
                                   zip(s.behav_logprobs, s.completion_mask, strict=True)])
        for s in samples
    ]  # fmt: skip
    everything = [replace(s, completion_mask=None) for s in samples]
    cfg = TrainerConfig(micro_batch=4, optimizer_steps=1, loss="grpo", is_correction="token_tis")
    out = {}
    for name, batch in (("masked", samples), ("forged", forged), ("all", everything)):
        m = copy.deepcopy(model)
        opt = torch.optim.SGD(m.parameters(), lr=0.1)
        stats = grpo_update(m, None, opt, batch, cfg, 200.0, 0)
        out[name] = (stats, torch.cat([p.detach().flatten() for p in m.parameters()]))
    assert out["masked"][0].tokens == sum(s.model_tokens for s in samples)
    assert out["all"][0].tokens == sum(len(s.completion_tokens) for s in samples)
    assert torch.equal(out["masked"][1], out["forged"][1])
    assert out["masked"][0].mismatch == out["forged"][0].mismatch
    assert not torch.allclose(out["masked"][1], out["all"][1])
