"""The quiet cheats the emulated swarm runs among honest workers (swarmrl/sim/cheats.py):
each does the one dishonest thing it is named for, and nothing else."""

from __future__ import annotations

import torch

from swarmrl.protocol.assign import Assignment
from swarmrl.protocol.rollouts import read_rollouts, write_rollouts
from swarmrl.sim.registry import make_cheat
from tests.unit.test_rollouts import make_rows


class Loaded:
    """A backend as `after_load` sees it: the model the worker just loaded."""

    def __init__(self, model):
        self.model = model


def _version(model: torch.nn.Module, value: float) -> None:
    with torch.no_grad():
        for p in model.parameters():
            p.fill_(value)


def test_stale_policy_runs_the_version_before_the_newest_it_loaded():
    model = torch.nn.Linear(3, 2)
    cheat, backend = make_cheat("stale-policy"), Loaded(model)
    _version(model, 1.0)  # version 1 loaded: nothing older held, honest
    cheat.after_load(backend)
    assert torch.all(model.weight == 1.0)
    for v in (2.0, 3.0):
        _version(model, v)  # the worker loads version v ...
        cheat.after_load(backend)
        assert torch.all(model.weight == v - 1.0)  # ... and generates with v - 1


def test_weight_noise_moves_each_tensor_by_a_thousandth_of_its_spread():
    torch.manual_seed(0)
    model = torch.nn.Linear(64, 64)
    before = model.weight.detach().clone()
    make_cheat("weight-noise", seed=1).after_load(Loaded(model))
    moved = (model.weight - before).std() / before.std()
    assert 5e-4 < moved < 2e-3


def test_a_copier_sends_another_nodes_newest_file_as_its_own(tmp_path, monkeypatch):
    from swarmrl.sim import cheats

    sent: list[bytes] = []
    monkeypatch.setattr(cheats.worker, "upload_file", lambda client, a, data: sent.append(data))
    copier = make_cheat("copier")
    copier.store = tmp_path / "store"
    a = Assignment(step=9, policy_step=8, seed=1, counter=3)
    mine = write_rollouts([r | {"node": "cd" * 16} for r in make_rows()])
    copier.upload(None, a, mine)  # nothing to copy yet: its own honest file
    assert sent[-1] == mine
    other = copier.store / "rollouts" / "step_000005"
    other.mkdir(parents=True)
    theirs = make_rows(step=5, policy=4)
    (other / f"{'ab' * 16}-1-p000004-g2.parquet").write_bytes(write_rollouts(theirs))
    copier.upload(None, a, mine)
    got = read_rollouts(sent[-1])
    assert [r["completion_tokens"] for r in got] == [r["completion_tokens"] for r in theirs]
    assert {(r["node"], r["step"], r["policy_step"]) for r in got} == {("cd" * 16, 9, 8)}
