"""The Python API (swarmrl/api.py): the names, a cheap import, a config built in code,
and the functions the CLI calls. No swarm is started here (tests/integration does)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

import swarmrl
from swarmrl.config.overrides import config_overrides
from swarmrl.errors import ConfigError, LaunchError

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "configs" / "tiny.toml"


def test_the_api_imports_from_swarmrl():
    from swarmrl import RunConfig, SwarmResult, evaluate, join, load_config, run_swarm

    assert callable(evaluate) and callable(join) and callable(run_swarm)
    assert isinstance(load_config(TINY), RunConfig) and SwarmResult.__name__ == "SwarmResult"
    assert set(swarmrl.__all__) <= set(dir(swarmrl))
    with pytest.raises(AttributeError, match="no attribute 'bogus'"):
        swarmrl.bogus  # noqa: B018


def test_import_swarmrl_does_not_import_torch():
    code = (
        "import sys, swarmrl; assert 'torch' not in sys.modules; "
        "swarmrl.RunConfig, swarmrl.run_swarm, swarmrl.evaluate, swarmrl.join; "
        "assert 'torch' not in sys.modules, 'the API names import torch'"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr


def test_a_config_built_in_code_validates():
    cfg = swarmrl.RunConfig(name="in-code", trainer={"steps": 3}, task={"name": "addition"})
    assert cfg.trainer.steps == 3 and cfg.task.name == "addition"
    with pytest.raises(ValidationError, match=r"trainer\.lr"):
        swarmrl.RunConfig(trainer={"lr": -1})
    with pytest.raises(ValidationError, match="stepz"):
        swarmrl.RunConfig(trainer={"stepz": 3})
    with pytest.raises(ValidationError, match="greater than 0"):  # assignments are checked too
        cfg.trainer.lr = -1.0


def test_a_config_that_skipped_validation_is_refused_before_anything_starts(tmp_path):
    cfg = swarmrl.RunConfig(runs_dir=str(tmp_path / "runs"))
    bad = cfg.model_copy(update={"trainer": cfg.trainer.model_copy(update={"lr": -1.0})})
    with pytest.raises(ConfigError, match=r"trainer\.lr: Input should be greater than 0"):
        swarmrl.run_swarm(bad, fresh=True)
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("name", ["tiny", "default", "multiplication", "smollm2-addition"])
def test_a_config_survives_being_passed_as_overrides(name):
    cfg = swarmrl.load_config(ROOT / "configs" / f"{name}.toml")
    cfg.name = "in-code"
    cfg.task.instruction = 'Say "ok".\nThen stop. \u00e9'
    cfg.task.gym_options = {"a.b": {"x": 1.5, "y": [1, "z"]}}
    cfg.trainer.lr = 1e-5
    assert swarmrl.load_config(None, config_overrides(cfg)) == cfg
    assert config_overrides(swarmrl.RunConfig()) == []


def test_run_swarm_hands_a_config_in_code_to_the_launcher(monkeypatch, tmp_path):
    import swarmrl.launch.swarm as swarm

    seen = {}

    def launch(cfg, config_path, overrides, resume, fresh, cheaters=0, cheats=None):
        seen.update(cfg=cfg, path=config_path, overrides=overrides, fresh=fresh, cheats=cheats)
        cfg.run_dir.mkdir(parents=True)
        (cfg.run_dir / "eval.json").write_text(json.dumps({"final_model": {"accuracy": 0.5}}))
        return 0

    monkeypatch.setattr(swarm, "launch", launch)
    cfg = swarmrl.load_config(TINY, [f"runs_dir={json.dumps(str(tmp_path))}"])
    cfg.trainer.steps = 7
    res = swarmrl.run_swarm(cfg, ["seed=5"], fresh=True, cheaters=1, cheats=["other-model"])
    assert res.ok and res.run_dir == tmp_path / "tiny" and res.final_model is None
    assert res.heldout["final_model"]["accuracy"] == 0.5 and res.metrics() == []
    assert seen["path"] is None and seen["fresh"] and seen["cheats"] == ["other-model"]
    assert "trainer.steps=7" in seen["overrides"] and seen["overrides"][-1] == "seed=5"
    assert seen["cfg"].seed == 5 and seen["cfg"].trainer.steps == 7
    # a file path is passed on as --config PATH, as the command always has
    swarmrl.run_swarm(TINY, [f"runs_dir={json.dumps(str(tmp_path / 'b'))}"], resume=True)
    assert seen["path"] == str(TINY) and seen["overrides"][0].startswith("runs_dir=")


def test_run_swarm_refuses_fresh_with_resume():
    with pytest.raises(LaunchError, match="fresh and resume"):
        swarmrl.run_swarm(TINY, fresh=True, resume=True)


def test_evaluate_returns_the_scores(random_model_dir):
    res = swarmrl.evaluate(random_model_dir, TINY, ["task.max_len=4"], n=4, threads=1)
    assert res["task"] == "reverse_text" and res["n"] == 4 and res["level"] == 0
    assert 0 <= res["accuracy"] <= 1 and 0 <= res["mean_reward"] <= 1
    assert res["model"] == str(random_model_dir) and len(res["samples"]) == 4
    with pytest.raises(ConfigError, match="target_length"):
        swarmrl.evaluate(random_model_dir, TINY, target_length=-1)
