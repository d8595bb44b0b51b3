"""The configuration: one pydantic section per component, in a module of its
own, loaded from TOML with dotted overrides (run.py). An unknown key is an
error that names it.

This package imports nothing heavy, so that `swarmrl --help` stays fast.
"""

from swarmrl.config.base import ConfigError, Section
from swarmrl.config.env import EnvConfig
from swarmrl.config.inference import InferenceConfig, ModelConfig, SamplingConfig, WorkerConfig
from swarmrl.config.launch import LauncherConfig
from swarmrl.config.orchestrator import OrchestratorConfig
from swarmrl.config.run import RunConfig, RunPaths, load_config, parse_override
from swarmrl.config.shardcast import ShardcastConfig
from swarmrl.config.tasks import CodeConfig, CurriculumConfig, LengthRewardConfig, TaskConfig
from swarmrl.config.trainer import TrainerConfig, TrainerDilocoConfig
from swarmrl.config.validator import ValidatorConfig

__all__ = [
    "CodeConfig",
    "ConfigError",
    "CurriculumConfig",
    "EnvConfig",
    "InferenceConfig",
    "LauncherConfig",
    "LengthRewardConfig",
    "ModelConfig",
    "OrchestratorConfig",
    "RunConfig",
    "RunPaths",
    "SamplingConfig",
    "Section",
    "ShardcastConfig",
    "TaskConfig",
    "TrainerConfig",
    "TrainerDilocoConfig",
    "ValidatorConfig",
    "WorkerConfig",
    "load_config",
    "parse_override",
]
