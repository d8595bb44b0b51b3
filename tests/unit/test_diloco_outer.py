"""The outer step on hand-computed numbers, with a one-site stand-in for torchft's Manager
(the manager is a seam we do not own; the multi-site paths run in
tests/integration/test_diloco.py on real quorums)."""

from __future__ import annotations

import pytest
import torch

from swarmrl.apps.pretrain.corpus import corpus_lines
from swarmrl.config.diloco import DilocoConfig
from swarmrl.config.pretrain import PretrainConfig
from swarmrl.diloco.outer import OuterLoop


class _Done:
    def wait(self, timeout=None):
        return True


class _OneRankGroup:
    def allreduce(self, tensors, opts):  # the sum over one rank is the tensor itself
        return _Done()


class _OneSiteManager:
    def __init__(self, commit: bool = True):
        self._pg = _OneRankGroup()
        self.commit = commit
        self.fns = {}

    def register_state_dict_fn(self, key, load, save):
        self.fns[key] = (load, save)

    def start_quorum(self):
        pass

    def num_participants(self):
        return 1

    def errored(self):
        return None

    def report_error(self, e):
        raise AssertionError(f"unexpected error {e}")

    def should_commit(self):
        return self.commit


def _model():
    torch.manual_seed(0)
    return torch.nn.Linear(3, 2, bias=False)


def test_outer_nesterov_step_hand_computed():
    model = _model()
    g0 = model.weight.detach().clone()
    outer = OuterLoop(
        model, DilocoConfig(bits=32, outer_lr=0.7, outer_momentum=0.9), _OneSiteManager()
    )
    with torch.no_grad():
        model.weight -= 0.1  # inner steps moved the local weights by -0.1
    res = outer.sync(has_delta=True)
    assert res.committed and res.contributors == 1 and outer.outer_steps == 1
    # pseudo-gradient d = 0.1; Nesterov's first step: g - lr * (d + m * d)
    expect = g0 - 0.7 * (0.1 + 0.9 * 0.1)
    assert torch.allclose(outer.global_params[0], expect, atol=1e-6)
    assert torch.equal(model.weight.detach(), outer.global_params[0].detach())  # restart from it


def test_nothing_to_contribute_changes_nothing():
    model = _model()
    g0 = model.weight.detach().clone()
    outer = OuterLoop(model, DilocoConfig(bits=32), _OneSiteManager())
    res = outer.sync(has_delta=False)
    assert res.committed and res.contributors == 0 and outer.outer_steps == 0
    assert torch.equal(outer.global_params[0].detach(), g0)


def test_uncommitted_sync_keeps_local_weights_for_a_retry():
    model = _model()
    g0 = model.weight.detach().clone()
    outer = OuterLoop(model, DilocoConfig(bits=32), _OneSiteManager(commit=False))
    with torch.no_grad():
        model.weight += 1.0
    assert not outer.sync(has_delta=True).committed
    assert torch.equal(outer.global_params[0].detach(), g0)
    assert torch.equal(model.weight.detach(), g0 + 1.0)


def test_recovered_state_round_trips_and_marks_the_site_healed():
    src = OuterLoop(_model(), DilocoConfig(bits=32), _OneSiteManager())
    with torch.no_grad():
        src.model.weight -= 0.5
    src.sync(has_delta=True)
    joiner_model = torch.nn.Linear(3, 2, bias=False)
    joiner = OuterLoop(joiner_model, DilocoConfig(bits=32), _OneSiteManager())
    joiner.load_state_dict(src.state_dict())
    assert joiner.outer_steps == 1
    assert torch.equal(joiner_model.weight.detach(), src.global_params[0].detach())
    assert joiner.outer_opt.state_dict()["state"][0]["momentum_buffer"].allclose(
        src.outer_opt.state_dict()["state"][0]["momentum_buffer"]
    )


def test_corpus_is_the_same_from_the_same_seed_and_config_rejects_bad_values():
    assert corpus_lines(50, 3) == corpus_lines(50, 3) != corpus_lines(50, 4)
    with pytest.raises(ValueError, match="bits"):
        PretrainConfig.model_validate({"diloco": {"bits": 4}})
    with pytest.raises(ValueError, match="inner_steps"):
        PretrainConfig.model_validate({"diloco": {"inner_steps": 0}})


def test_async_checkpoints_complete_files_only_and_keep(tmp_path):
    from swarmrl.diloco.checkpoint import AsyncCheckpointer

    ckpt = AsyncCheckpointer(tmp_path / "site0", keep=2)
    (tmp_path / "site0" / "outer-99.pt.tmp").write_bytes(b"half a file")  # a copy cut short
    for step in (2, 4, 6):
        assert ckpt.save(step, {"w": torch.full((3,), float(step))})
        ckpt.wait()
    assert ckpt.error is None
    step, path = ckpt.latest()
    assert step == 6 and torch.load(path)["w"].tolist() == [6.0, 6.0, 6.0]
    assert sorted(p.name for p in (tmp_path / "site0").glob("outer-*.pt")) == [
        "outer-4.pt",
        "outer-6.pt",
    ]
