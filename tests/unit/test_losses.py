"""The loss family (trainer/losses/) and the step's loss on hand-computed tensors:
values and gradients per token, the normalisers, the importance weight."""

from __future__ import annotations

import math

import pytest
import torch

from swarmrl.config import TrainerConfig
from swarmrl.trainer import losses
from swarmrl.trainer.loss import step_loss

CFG = TrainerConfig()  # ε 0.2, δ 4, ε_high 0.28, gspo 3e-4/4e-4, cispo cap 5


def _token(name: str, ratio: float, adv: float, weight: float = 1.0, cfg=CFG):
    """Loss, d loss / d logp and clipped flag of one token with π_θ/π_prox = ratio."""
    prox = torch.full((1, 1), math.log(0.5))
    logp = (prox + math.log(ratio)).clone().requires_grad_(True)
    total, no_grad = losses.get(name).loss(
        logp, prox, torch.tensor([[adv]]), torch.ones(1, 1), torch.full((1, 1), weight), cfg
    )
    total.backward()
    return total.item(), logp.grad.item(), bool(no_grad.item())


@pytest.mark.parametrize(
    "ratio,adv,want_loss,want_grad,clipped",
    [
        (1.0, 1.0, -1.0, -1.0, False),  # on-policy: loss −A, d/dlogp = −r·A
        (1.5, 1.0, -1.2, 0.0, True),  # A > 0, r > 1+ε: clipped at 1.2, no gradient
        (0.5, -1.0, 0.8, 0.0, True),  # A < 0, r < 1−ε: clipped at 0.8, no gradient
        (1.5, -1.0, 1.5, 1.5, False),  # A < 0, r in (1+ε, δ]: unclipped, grad −r·A = 1.5
        (0.5, 2.0, -1.0, -1.0, False),  # A > 0, r < 1−ε: unclipped side wins, grad −r·A = −1
        (5.0, -1.0, 4.0, 0.0, True),  # A < 0, r > δ: bounded by δ·|A| = 4, no gradient
        (100.0, -2.5, 10.0, 0.0, True),  # bound scales with |A|: δ·2.5
    ],
)
def test_grpo_token(ratio, adv, want_loss, want_grad, clipped):
    loss, grad, no_grad = _token("grpo", ratio, adv)
    assert loss == pytest.approx(want_loss, rel=1e-5)
    assert grad == pytest.approx(want_grad, abs=1e-5)
    assert no_grad == clipped


@pytest.mark.parametrize(
    "ratio,adv,want_loss,want_grad,clipped",
    [
        (1.25, 1.0, -1.25, -1.25, False),  # inside clip-higher's 1.28: grpo would clip at 1.2
        (1.3, 1.0, -1.28, 0.0, True),  # above 1 + ε_high
        (0.7, -1.0, 0.8, 0.0, True),  # below 1 − ε_low
        (5.0, -1.0, 5.0, 5.0, False),  # no δ: A < 0 unbounded (PPO's own behaviour)
    ],
)
def test_dapo_token(ratio, adv, want_loss, want_grad, clipped):
    loss, grad, no_grad = _token("dapo", ratio, adv)
    assert loss == pytest.approx(want_loss, rel=1e-5)
    assert grad == pytest.approx(want_grad, abs=1e-5)
    assert no_grad == clipped


@pytest.mark.parametrize(
    "ratio,adv,want_loss,want_grad,clipped",
    [
        (1.25, 1.0, -1.2, 0.0, True),  # symmetric ε = 0.2
        (0.9, 1.0, -0.9, -0.9, False),
        (5.0, -1.0, 5.0, 5.0, False),
    ],
)
def test_dr_grpo_token(ratio, adv, want_loss, want_grad, clipped):
    loss, grad, no_grad = _token("dr_grpo", ratio, adv)
    assert loss == pytest.approx(want_loss, rel=1e-5)
    assert grad == pytest.approx(want_grad, abs=1e-5)
    assert no_grad == clipped


@pytest.mark.parametrize(
    "ratio,adv,want_grad,clipped",
    [
        (1.0, 1.0, -1.0, False),  # −sg(r)·A·∇logp
        (3.0, -2.0, 6.0, False),  # r below the cap of 5: weight 3, A = −2
        (10.0, 1.0, -5.0, True),  # weight capped at 5, the gradient kept
        (0.01, 1.0, -0.01, False),  # no lower bound
    ],
)
def test_cispo_token(ratio, adv, want_grad, clipped):
    loss, grad, no_grad = _token("cispo", ratio, adv)
    coef = min(ratio, 5.0)
    logp = math.log(0.5 * ratio)
    assert loss == pytest.approx(-coef * adv * logp, rel=1e-5)
    assert grad == pytest.approx(want_grad, rel=1e-5)
    assert no_grad == clipped


@pytest.mark.parametrize("name", sorted(losses.LOSSES))
def test_the_importance_weight_scales_loss_and_gradient(name):
    full = _token(name, 1.1, 0.7)
    half = _token(name, 1.1, 0.7, weight=0.5)
    assert half[0] == pytest.approx(full[0] / 2, rel=1e-6)
    assert half[1] == pytest.approx(full[1] / 2, rel=1e-6)


def test_gspo_sequence_ratio_and_gradient():
    """Two tokens with log-ratios 2e-4 and 4e-4: s = exp(3e-4) is inside [1 − 3e-4,
    1 + 4e-4], loss −s·A, and each token's gradient −s·A/|y|. The padding token counts
    for nothing."""
    prox = torch.log(torch.tensor([[0.5, 0.25, 0.9]]))
    logp = (prox + torch.tensor([[2e-4, 4e-4, 5.0]])).requires_grad_(True)
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    total, no_grad = losses.get("gspo").loss(logp, prox, torch.tensor([[2.0]]), mask, mask, CFG)
    total.backward()
    s = math.exp(3e-4)
    assert total.item() == pytest.approx(-2.0 * s, rel=1e-6)
    assert logp.grad[0].tolist() == pytest.approx([-s, -s, 0.0], rel=1e-5)
    assert not no_grad.any()
    # mean log-ratio 1e-3: s = e^0.001 > 1 + 4e-4, A > 0: clipped, no gradient at all
    logp = (prox + torch.tensor([[1e-3, 1e-3, 0.0]])).requires_grad_(True)
    total, no_grad = losses.get("gspo").loss(logp, prox, torch.tensor([[1.0]]), mask, mask, CFG)
    total.backward()
    assert total.item() == pytest.approx(-(1 + 4e-4), rel=1e-7)
    assert logp.grad.abs().sum().item() == 0.0
    assert no_grad.tolist() == [[True, True, False]]


def _old_grpo_loss(logp, old, adv, mask, budget, eps=0.2, delta=4.0):
    """The loss swarmrl had before the family existed, restated for the comparison."""
    r = torch.exp(logp - old)
    rho = torch.clamp(r, max=delta)
    token = torch.maximum(-rho * adv, -torch.clamp(rho, 1 - eps, 1 + eps) * adv)
    return (token * mask).sum() / budget


def test_grpo_without_correction_is_the_old_loss_exactly():
    gen = torch.Generator().manual_seed(0)
    logp = (torch.randn(4, 6, generator=gen) - 2).requires_grad_(True)
    old = logp.detach() + 0.3 * torch.randn(4, 6, generator=gen)
    adv = torch.randn(4, 1, generator=gen)
    mask = torch.rand(4, 6, generator=gen) > 0.3
    want = _old_grpo_loss(logp, old, adv, mask.float(), 17.0)
    (g_want,) = torch.autograd.grad(want, logp)
    out = step_loss(logp, old, adv, mask, mask.float(), 17.0, CFG)
    (g_out,) = torch.autograd.grad(out.loss, logp)
    assert out.loss.item() == want.item()
    assert torch.equal(g_out, g_want)
    assert out.tokens == float(mask.sum())


def test_normaliser_entropy_bonus_and_kl():
    logp = torch.log(torch.tensor([[0.5]]))
    ref = torch.log(torch.tensor([[0.25]]))
    one = torch.ones(1, 1)
    cfg = CFG.model_copy(update={"entropy_coef": 0.1, "kl_coef": 1.0})
    base = step_loss(logp, logp, torch.zeros(1, 1), one.bool(), one, 1.0, CFG)
    assert base.loss.item() == pytest.approx(0.0)
    ent = step_loss(logp, logp, torch.zeros(1, 1), one.bool(), one, 2.0, cfg, entropy=one * 0.7)
    assert ent.loss.item() == pytest.approx(-0.07 / 2)
    kl = step_loss(logp, logp, torch.zeros(1, 1), one.bool(), one, 1.0, cfg, ref_logp=ref)
    d = math.log(0.5)  # ref − logp = log(0.25/0.5)
    assert kl.loss.item() == pytest.approx(math.exp(d) - d - 1.0, rel=1e-5)
    assert kl.kl_sum == pytest.approx(math.exp(d) - d - 1.0, rel=1e-5)


def test_each_loss_normalises_as_it_says():
    from swarmrl.trainer.batch import Sample
    from swarmrl.trainer.step import _normaliser

    mini = [Sample([1], [2, 3, 4], 0, 0, 0, 0, 0), Sample([1], [2], 0, 0, 0, 0, 0)]
    got = {n: _normaliser(CFG.model_copy(update={"loss": n}), mini, 96.0) for n in losses.LOSSES}
    assert got == {"grpo": 96.0, "dr_grpo": 96.0, "dapo": 4.0, "cispo": 4.0, "gspo": 2.0}


def test_advantage_scales():
    from swarmrl.trainer.advantages import centred_rewards, scale_advantages
    from swarmrl.trainer.batch import Sample

    def batch():
        out = []
        for rewards in ([0.0, 1.0], [0.0, 0.0, 0.0, 3.0]):
            centred, std = centred_rewards(rewards)
            out += [Sample([1], [2], c, 0, 0, 0, 0, group_std=std) for c in centred]
        return out

    # batch: std over the six centred rewards, sqrt((2·0.25 + 3·0.5625 + 5.0625) / 6)
    for scale, want in {
        "none": [-0.5, 0.5, -0.75, -0.75, -0.75, 2.25],
        "group": [-1, 1, -1 / math.sqrt(3), -1 / math.sqrt(3), -1 / math.sqrt(3), math.sqrt(3)],
        "batch": [x / math.sqrt(7.25 / 6) for x in [-0.5, 0.5, -0.75, -0.75, -0.75, 2.25]],
    }.items():
        b = batch()
        scale_advantages(b, scale)
        assert [s.advantage for s in b] == pytest.approx(want, rel=1e-5), scale
    assert losses.advantage_scale(CFG.model_copy(update={"loss": "dr_grpo"})) == "none"
    assert losses.advantage_scale(CFG) == "group"
