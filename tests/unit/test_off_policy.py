"""The trainer's log-probs are the worker's sampling distribution, and stale samples
carry the importance weight π_n/π_{n−2} per token.

Files are written by the worker's own code (bench/rollout_files.py's Maker) at
T = 0.7 and top-p 0.9; the expected values are computed here from plain forward
passes, independently of trainer/step.py."""

from __future__ import annotations

import math
import shutil

import pytest
import torch
from transformers import AutoModelForCausalLM

from bench.rollout_files import Maker, issued, make_judge, small_run
from swarmrl.config import TrainerConfig
from swarmrl.protocol.rollouts import read_rollouts, write_rollouts
from swarmrl.sim.cheats import perturb
from swarmrl.toploc.sampling import nucleus_mask
from swarmrl.trainer import step as step_module
from swarmrl.trainer.batch import Sample
from swarmrl.trainer.step import grpo_update, token_logprobs

T, TOP_P = 0.7, 0.9


@pytest.fixture(scope="module")
def files(random_model_dir, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("offpolicy")
    cfg = small_run(
        tmp, random_model_dir, f"sampling.temperature={T}", f"sampling.top_p={TOP_P}",
        "sampling.max_new_tokens=12",
    )  # fmt: skip
    maker = Maker(cfg, tmp, name="worker")
    made = [maker.file() for _ in range(2)]
    return cfg, tmp, made


def _samples(data: bytes) -> list[Sample]:
    return [
        Sample(
            r["prompt_tokens"],
            r["completion_tokens"],
            1.0 - 2.0 * (i % 2),
            r["reward"],
            0,
            0,
            r["policy_step"],
            behav_logprobs=r["completion_logprobs"],
            temperature=r["temperature"],
        )  # fmt: skip
        for i, r in enumerate(read_rollouts(data))
    ]


def _sampled_logprobs(model, s: Sample) -> list[float]:
    """log p of each completion token under softmax(logits/T) over the nucleus, from one
    plain forward of prompt + completion."""
    ids = torch.tensor([s.prompt_tokens + s.completion_tokens])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0].float() / s.temperature
    p = len(s.prompt_tokens)
    out = []
    for t, tok in enumerate(s.completion_tokens):
        row = logits[p - 1 + t]
        keep = nucleus_mask(row[None], TOP_P)[0]
        keep[tok] = True
        out.append(float(row[tok] - torch.logsumexp(row[keep], -1)))
    return out


def test_trainer_logprobs_equal_the_workers_at_temperature_and_top_p(files, random_model_dir):
    cfg, _, made = files
    model = AutoModelForCausalLM.from_pretrained(random_model_dir).eval()
    samples = [s for _, data in made for s in _samples(data)]
    assert all(abs(s.temperature - T) < 1e-6 for s in samples)
    with torch.no_grad():
        logp, _, mask = token_logprobs(model, samples, 0, top_p=TOP_P)
    worst = 0.0
    for i, s in enumerate(samples):
        n = len(s.completion_tokens)
        assert mask[i].sum() == n
        mine = logp[i, :n].tolist()
        worst = max(worst, *(abs(a - b) for a, b in zip(mine, s.behav_logprobs, strict=True)))
        plain = _sampled_logprobs(model, s)
        assert mine == pytest.approx(plain, abs=1e-5)
    assert worst < 1e-5
    # the nucleus mattered: some token's probability was renormalised
    full = []
    for s in samples[:4]:
        ids = torch.tensor([s.prompt_tokens + s.completion_tokens])
        with torch.no_grad():
            lg = model(input_ids=ids).logits[0].float() / T
        p = len(s.prompt_tokens)
        full += [
            float(torch.log_softmax(lg[p - 1 + t], -1)[tok])
            for t, tok in enumerate(s.completion_tokens)
        ]
    recorded = [x for s in samples[:4] for x in s.behav_logprobs]
    assert max(a - b for a, b in zip(recorded, full, strict=True)) > 1e-3


def test_the_validator_checks_logprobs_of_the_sampled_distribution(files):
    cfg, tmp, made = files
    judge = make_judge(cfg, tmp)
    key, data = made[0]
    v = judge.judge(key, data, issued=issued(key))
    assert v.accepted, (v.check, v.reason)
    # the same tokens, with log-probs recorded at T = 1 over the whole vocabulary
    model = judge.backend.model
    rows = read_rollouts(data)
    for r in rows:
        ids = torch.tensor([r["prompt_tokens"] + r["completion_tokens"]])
        with torch.no_grad():
            lg = torch.log_softmax(model(input_ids=ids).logits[0].float(), -1)
        p = len(r["prompt_tokens"])
        r["completion_logprobs"] = [
            float(lg[p - 1 + t, tok]) for t, tok in enumerate(r["completion_tokens"])
        ]
    v = judge.judge(key, write_rollouts(rows), issued=issued(key))
    assert not v.accepted and v.check == "sampling", (v.check, v.reason)


def test_samples_of_version_n_minus_2_get_weight_pi_n_over_pi_n_minus_2(
    files, random_model_dir, tmp_path, monkeypatch
):
    """Files sampled by version n−2 (the model directory), trained by version n (the
    same weights moved): each token's weight is exp(log π_n − log π_{n−2})."""
    _, _, made = files
    old = AutoModelForCausalLM.from_pretrained(random_model_dir).eval()
    new_dir = tmp_path / "v2"
    shutil.copytree(random_model_dir, new_dir)
    new = AutoModelForCausalLM.from_pretrained(new_dir).eval()
    perturb(new, 0.02, seed=7)  # two versions later
    samples = _samples(made[0][1])
    want = [
        [
            math.exp(a - b)
            for a, b in zip(_sampled_logprobs(new, s), _sampled_logprobs(old, s), strict=True)
        ]  # fmt: skip
        for s in samples
    ]
    seen = []
    real = step_module.importance_weights

    def spy(prox, behav, mask, c):
        w, ex = real(prox, behav, mask, c)
        seen.append((w.detach().clone(), mask.clone()))
        return w, ex

    monkeypatch.setattr(step_module, "importance_weights", spy)
    cfg = TrainerConfig(is_correction="token_tis", is_cap=1e6, micro_batch=64, lr=1e-9)
    opt = torch.optim.SGD(new.parameters(), lr=0.0)
    stats = grpo_update(new, None, opt, samples, cfg, 100.0, 0, top_p=TOP_P)
    ((w, mask),) = seen
    for i, s in enumerate(samples):
        got = w[i, : len(s.completion_tokens)].tolist()
        assert got == pytest.approx(want[i], rel=1e-4)
    moved = [x for row in want for x in row]
    assert max(abs(x - 1) for x in moved) > 1e-2  # the versions do differ
    assert stats.mismatch.tokens == [float(len(s.completion_tokens)) for s in samples]
