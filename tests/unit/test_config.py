from pathlib import Path

import pytest

from swarmrl.apps.config_docs import config_docs
from swarmrl.config import ConfigError, load_config, parse_override

ROOT = Path(__file__).resolve().parents[2]


def test_defaults_and_overrides():
    cfg = load_config(
        None, ["trainer.lr=3e-4", "worker.group_size=4", "name=abc", "trainer.betas=[0.8, 0.9]"]
    )
    assert cfg.trainer.lr == 3e-4
    assert cfg.worker.group_size == 4
    assert cfg.name == "abc"
    assert cfg.trainer.betas == (0.8, 0.9)
    assert parse_override("model.path=models/x") == (["model", "path"], "models/x")


def test_unknown_key_is_named(tmp_path):
    f = tmp_path / "run.toml"
    f.write_text("[trainer]\nlearning_rate = 0.1\n")
    with pytest.raises(ConfigError, match=r"unknown key 'trainer.learning_rate'"):
        load_config(f)
    with pytest.raises(ConfigError, match=r"unknown key 'wokrer'"):
        load_config(None, ["wokrer.threads=2"])


def test_bad_value_is_named(tmp_path):
    with pytest.raises(ConfigError, match=r"trainer.epsilon: .*less than 1"):
        load_config(None, ["trainer.epsilon=1.5"])
    with pytest.raises(ConfigError, match=r"worker.group_size"):
        load_config(None, ["worker.group_size=many"])
    with pytest.raises(ConfigError, match=r"task.min_len \(9\) > task.max_len \(3\)"):
        load_config(None, ["task.min_len=9", "task.max_len=3"])
    f = tmp_path / "broken.toml"
    f.write_text("[trainer\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(f)
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "missing.toml")
    with pytest.raises(ConfigError, match="not of the form"):
        load_config(None, ["trainer.lr"])


def test_shipped_configs_load():
    from swarmrl.config.pretrain import PretrainConfig

    for f in sorted((ROOT / "configs").glob("*.toml")):
        load_config(f, schema=PretrainConfig if f.name == "diloco.toml" else None)


def test_config_docs_are_current():
    assert (ROOT / "docs" / "config.md").read_text() == config_docs() + "\n", (
        "run: swarmrl config-docs > docs/config.md"
    )
