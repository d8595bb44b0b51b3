"""Importance weights π_prox/π_behav and the mismatch figures, on hand-computed tensors."""

from __future__ import annotations

import math

import pytest
import torch

from swarmrl.trainer.batch import Sample
from swarmrl.trainer.correction import (
    Correction,
    Mismatch,
    importance_weights,
    mismatch_by_node,
    mismatch_metrics,
)

# two samples: log π_prox − log π_behav per token; the second has a padding token
X = torch.tensor([[math.log(3.0), math.log(0.25), 0.0], [math.log(1.5), math.log(1.2), 9.0]])
MASK = torch.tensor([[True, True, True], [True, True, False]])
BEHAV = torch.log(torch.tensor([[0.1, 0.4, 0.5], [0.2, 0.5, 0.01]]))
PROX = BEHAV + X


def _w(mode: str, **kw):
    w, ex = importance_weights(PROX, BEHAV, MASK, Correction(mode, **kw))
    return w.flatten().tolist(), ex.tolist()


def _approx(rows):
    return pytest.approx([x for row in rows for x in row])


def test_none_is_one_at_every_real_token():
    assert _w("none") == ([1, 1, 1, 1, 1, 0], [[False] * 3, [False] * 3])


def test_token_tis_truncates_at_c():
    w, ex = _w("token_tis", cap=2.0)
    assert w == _approx([[2.0, 0.25, 1.0], [1.5, 1.2, 0.0]])
    assert ex == [[True, False, False], [False, False, False]]


def test_token_mis_masks_outside_the_band():
    w, ex = _w("token_mis", low=0.5, high=2.0)
    assert w == _approx([[0.0, 0.0, 1.0], [1.5, 1.2, 0.0]])
    assert ex == [[True, True, False], [False, False, False]]


def test_seq_tis_and_seq_mis_use_the_product_of_the_real_tokens():
    # products: 3 · 0.25 · 1 = 0.75; 1.5 · 1.2 = 1.8 (the padding's e^9 is not counted)
    w, ex = _w("seq_tis", cap=1.5)
    assert w == _approx([[0.75] * 3, [1.5, 1.5, 0.0]])
    assert ex == [[False] * 3, [True, True, False]]
    w, ex = _w("seq_mis", low=0.8, high=2.0)
    assert w == _approx([[0.0] * 3, [1.8, 1.8, 0.0]])
    assert ex == [[True] * 3, [False] * 3]


def test_geo_mask_keeps_or_drops_whole_sequences_at_weight_one():
    # geometric means: 0.75^(1/3) = 0.909; 1.8^(1/2) = 1.342
    w, ex = _w("geo_mask", low=0.95, high=1.5)
    assert w == _approx([[0.0] * 3, [1.0, 1.0, 0.0]])
    assert ex == [[True] * 3, [False] * 3]


def test_geo_mask_has_bounds_of_its_own_and_they_fire():
    """The token bounds (0.5, 2) would keep a sequence whose every token the trainer
    deems 40% likelier than the worker did; geo_mask's own bounds (0.8, 1.25) mask it,
    and a sequence within 10% per token passes."""
    from swarmrl.config.trainer import TrainerConfig

    cfg = TrainerConfig(is_correction="geo_mask")
    c = Correction.of(cfg)
    assert (c.low, c.high) == (cfg.geo_low, cfg.geo_high) == (0.8, 1.25)
    assert Correction.of(TrainerConfig(is_correction="seq_mis")).low == cfg.is_low
    behav = torch.full((2, 4), -1.0)
    prox = behav + torch.tensor([[math.log(1.4)] * 4, [math.log(1.1)] * 4])
    mask = torch.ones(2, 4, dtype=torch.bool)
    _, ex = importance_weights(prox, behav, mask, c)
    assert ex.tolist() == [[True] * 4, [False] * 4]
    _, ex = importance_weights(prox, behav, mask, Correction("geo_mask", low=0.5, high=2.0))
    assert not ex.any()  # what the shared bounds did: nothing


def test_delta_must_lie_outside_the_clip_range():
    from swarmrl.config.trainer import TrainerConfig

    TrainerConfig(epsilon=0.2, delta=1.2)
    with pytest.raises(ValueError, match=r"delta \(1.1\) must be at least 1 \+ trainer.epsilon"):
        TrainerConfig(epsilon=0.2, delta=1.1)


def test_a_forged_low_logprob_weighs_at_most_c_or_nothing():
    behav = torch.full((1, 4), -30.0)  # claims the sampled tokens were nearly impossible
    prox = torch.full((1, 4), -1.0)
    mask = torch.ones(1, 4, dtype=torch.bool)
    for mode in ("token_tis", "seq_tis"):
        w, _ = importance_weights(prox, behav, mask, Correction(mode, cap=2.0))
        assert w.max().item() == 2.0
    for mode in ("token_mis", "seq_mis", "geo_mask"):
        w, _ = importance_weights(prox, behav, mask, Correction(mode))
        assert w.max().item() == 0.0


def _samples():
    def s(policy, node, checked, file):
        return Sample([1], [2, 3, 4], 0.0, 0, 0, 0, policy, node=node, checked=checked, file=file)

    return [s(10, "aa", True, "f1"), s(8, "bb", False, "f2")]


def test_mismatch_metrics_by_staleness_and_by_node():
    m = Mismatch.zeros(2)
    _, ex = importance_weights(PROX, BEHAV, MASK, Correction("token_tis", cap=2.0))
    m.add([0, 1], PROX, BEHAV, MASK, ex)
    k3 = [[math.exp(x) - 1 - x for x in row] for row in X.tolist()]
    kl0, kl1 = sum(k3[0]), sum(k3[1][:2])
    assert m.kl == pytest.approx([kl0, kl1])
    assert m.tokens == [3.0, 2.0] and m.excluded == [1.0, 0.0]
    got = mismatch_metrics(_samples(), m, step=10)
    xs = [x for row, n in zip(X.tolist(), (3, 2), strict=True) for x in row[:n]]
    mean = sum(xs) / 5
    assert got["mismatch_kl"] == pytest.approx((kl0 + kl1) / 5)
    assert got["is_excluded_fraction"] == pytest.approx(0.2)
    assert got["log_ratio_std"] == pytest.approx(math.sqrt(sum((x - mean) ** 2 for x in xs) / 5))
    # geometric means 0.75^(1/3) and 1.8^(1/2): of two, the nearest ranks are each
    assert got["geo_weight_p05"] == pytest.approx(0.75 ** (1 / 3))
    assert got["geo_weight_p95"] == pytest.approx(1.8**0.5)
    assert got["mismatch_kl_staleness_0"] == pytest.approx(kl0 / 3)
    assert got["mismatch_kl_staleness_2"] == pytest.approx(kl1 / 2)
    nodes = mismatch_by_node(_samples(), m, step=10)
    assert nodes == [
        {"node": "aa", "checked": True, "staleness": 0, "tokens": 3, "kl": pytest.approx(kl0 / 3),
         "truncated": pytest.approx(1 / 3), "files": 1},
        {"node": "bb", "checked": False, "staleness": 2, "tokens": 2, "kl": pytest.approx(kl1 / 2),
         "truncated": 0.0, "files": 1},
    ]  # fmt: skip
    assert Mismatch.unflat(m.flat()) == m


def test_forged_logprobs_keep_the_figures_finite_and_within_what_the_orchestrator_takes():
    behav = torch.tensor([[-1e30, -25.0, -0.1]])  # finite, as a file may hold them
    prox = torch.full((1, 3), -0.5)
    mask = torch.ones(1, 3, dtype=torch.bool)
    m = Mismatch.zeros(1)
    _, ex = importance_weights(prox, behav, mask, Correction("token_tis"))
    m.add([0], prox, behav, mask, ex)
    assert all(math.isfinite(v) for v in m.flat())
    (node,) = mismatch_by_node(_samples()[:1], m, 10)
    assert node["kl"] == 1e6 and math.isfinite(
        mismatch_metrics(_samples()[:1], m, 10)["mismatch_kl"]
    )
