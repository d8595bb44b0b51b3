"""A whole run's configuration (`RunConfig`, one section per component), its
directory layout (`RunPaths`), and the TOML loader.

Every field carries a description (docs/config.md is generated from them by
`swarmrl config-docs`, and a test keeps the two in agreement) and its bounds.
Unknown keys are errors that name the key; dotted overrides on the command
line (`trainer.lr=3e-4`) are parsed as TOML values, falling back to strings.

This module imports nothing heavy so that `swarmrl --help` stays fast.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field, ValidationError

from swarmrl.config.base import ConfigError, Section
from swarmrl.config.env import EnvConfig
from swarmrl.config.inference import InferenceConfig, ModelConfig, SamplingConfig, WorkerConfig
from swarmrl.config.launch import LauncherConfig
from swarmrl.config.orchestrator import OrchestratorConfig
from swarmrl.config.shardcast import ShardcastConfig
from swarmrl.config.tasks import CodeConfig, CurriculumConfig, LengthRewardConfig, TaskConfig
from swarmrl.config.tracking import TrackingConfig
from swarmrl.config.trainer import TrainerConfig
from swarmrl.config.validator import ValidatorConfig


@dataclass(frozen=True)
class RunPaths:
    """The layout of runs/<name>/, shared by every process of the run."""

    run: Path

    @property
    def weights(self) -> Path:  # step_NNNNNN/ versions the trainer publishes
        return self.run / "weights"

    @property
    def store(self) -> Path:  # the orchestrator's local object store
        return self.run / "store"

    @property
    def metrics(self) -> Path:  # the trainer's metrics.jsonl
        return self.run / "metrics.jsonl"

    @property
    def published(self) -> Path:  # published.jsonl: each version's bytes, and its patch
        return self.run / "published.jsonl"

    @property
    def trainer_state(self) -> Path:  # optimizer checkpoints, diloco.pt
        return self.run / "trainer_state"

    @property
    def logs(self) -> Path:  # one log per process
        return self.run / "logs"

    @property
    def keys(self) -> Path:  # trainer and validator keys, the operator token
        return self.run / "keys"

    @property
    def nodes(self) -> Path:  # nodes/<name>/: each local worker's home
        return self.run / "nodes"

    @property
    def relays(self) -> Path:  # relays/<k>/: each local relay's directory
        return self.run / "relays"

    @property
    def tensorboard(self) -> Path:  # TensorBoard event files ([tracking])
        return self.run / "tensorboard"

    @property
    def wandb(self) -> Path:  # wandb/: W&B's run directories ([tracking])
        return self.run / "wandb"

    @property
    def verdicts(self) -> Path:  # the validators' verdicts.jsonl
        return self.run / "verdicts.jsonl"

    @property
    def orchestrator(self) -> Path:  # the orchestrator's database and secrets
        return self.run / "orchestrator"


class RunConfig(Section):
    """A whole run."""

    name: str = Field("tiny", pattern=r"^[A-Za-z0-9_.-]+$", description="Run name.")
    runs_dir: str = Field("runs", description="Directory holding runs/<name>/.")
    seed: int = Field(0, ge=0, le=2**62, description="Root seed of the run.")
    async_level: int = Field(
        2, ge=0, le=64, description="Max policy versions a rollout may lag its step."
    )
    model: ModelConfig = Field(default_factory=ModelConfig, description="Model.")
    task: TaskConfig = Field(default_factory=TaskConfig, description="Task.")
    env: EnvConfig = Field(default_factory=EnvConfig, description="Multi-turn environment (tools).")
    code: CodeConfig = Field(default_factory=CodeConfig, description="Code tasks.")
    length_reward: LengthRewardConfig = Field(
        default_factory=LengthRewardConfig, description="Length reward."
    )
    curriculum: CurriculumConfig = Field(
        default_factory=CurriculumConfig, description="Adaptive difficulty."
    )
    sampling: SamplingConfig = Field(default_factory=SamplingConfig, description="Sampling.")
    worker: WorkerConfig = Field(default_factory=WorkerConfig, description="Workers.")
    inference: InferenceConfig = Field(
        default_factory=InferenceConfig, description="Generation engine."
    )
    trainer: TrainerConfig = Field(default_factory=TrainerConfig, description="Trainer.")
    launcher: LauncherConfig = Field(default_factory=LauncherConfig, description="Launcher.")
    shardcast: ShardcastConfig = Field(
        default_factory=ShardcastConfig, description="Weights broadcast."
    )
    validator: ValidatorConfig = Field(
        default_factory=ValidatorConfig, description="Validation of rollouts."
    )
    orchestrator: OrchestratorConfig = Field(
        default_factory=OrchestratorConfig, description="The orchestrator service."
    )
    tracking: TrackingConfig = Field(
        default_factory=TrackingConfig, description="Experiment trackers."
    )

    @property
    def run_dir(self) -> Path:
        return Path(self.runs_dir) / self.name

    @property
    def paths(self) -> RunPaths:
        """The layout of runs/<name>/, shared by every process of the run."""
        return RunPaths(self.run_dir)


def parse_override(item: str) -> tuple[list[str], Any]:
    """Parse `a.b.c=value`; the value is read as TOML, or kept as a string."""
    if "=" not in item:
        raise ConfigError(f"override {item!r} is not of the form key.path=value")
    key, raw = item.split("=", 1)
    path = key.strip().split(".")
    if not all(path):
        raise ConfigError(f"override {item!r} has an empty key part")
    try:
        value = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw
    return path, value


def _set_dotted(data: dict, path: list[str], value: Any) -> None:
    node = data
    for part in path[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"override {'.'.join(path)}: {part} is not a section")
        node = child
    node[path[-1]] = value


def _format_error(err: ValidationError) -> str:
    lines = []
    for e in err.errors():
        where = ".".join(str(p) for p in e["loc"]) or "<root>"
        if e["type"] == "extra_forbidden":
            lines.append(f"unknown key '{where}'")
        else:
            lines.append(f"{where}: {e['msg']} (got {e.get('input')!r})")
    return "; ".join(lines)


def load_config(
    path: str | Path | None = None,
    overrides: list[str] | None = None,
    schema: type[BaseModel] | None = None,
) -> Any:
    """Load a RunConfig (or `schema`) from a TOML file (or defaults) plus dotted overrides."""
    data: dict = {}
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"config file {p} does not exist")
        try:
            data = tomllib.loads(p.read_text())
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(f"config file {p} is not valid TOML: {e}") from e
    for item in overrides or []:
        key_path, value = parse_override(item)
        _set_dotted(data, key_path, value)
    try:
        return (schema or RunConfig).model_validate(data)
    except ValidationError as e:
        where = f" in {path}" if path else ""
        raise ConfigError(f"bad configuration{where}: {_format_error(e)}") from None
