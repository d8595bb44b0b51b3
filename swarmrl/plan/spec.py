"""What the planner's model (plan/model.py) is given and what it gives back: the
measured costs, the swarm's shape and events, and the outcome."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Costs:
    """Measured costs: `swarmrl plan --calibrate` measures them on this machine, and
    `--from-run` reads them from a run (under load from an emulated one)."""

    file_s: float  # core-seconds to generate one file (of `groups` groups) on the reference device
    train_s: float  # core-seconds of one trainer update
    validate_s: float  # core-seconds to check one file (of `groups` groups)
    load_s: float  # core-seconds for a node to take in a version it downloaded
    version_mb: float  # what one version sends down the tree (full, or a patch)
    start_s: float = 0.0  # core-seconds from a worker's start to its asking for work
    fetch_s_per_mb: float = 0.0  # core-seconds a node spends per MB it downloads (checks)
    idle_cores: float = 0.0  # what a worker process burns besides its files (heartbeats...)
    submit_s: float = 0.0  # core-seconds from a file generated to its submission (upload)
    file_mb: float = 0.05  # one rollout file
    signal: float = 1.0  # share of groups with signal
    request_ms: float = 2.0  # the orchestrator's service time for one request
    relay_s_per_mb: float = 0.0  # core-seconds a relay spends per MB it takes in or sends
    orchestrator_s: float = 0.0  # core-seconds the orchestrator spends per file (its requests)
    fetch_latency_s: float = 0.0  # a node's download beyond its bytes at its link's rate
    publish_s: float = 0.0  # core-seconds from an update's end to its version's publication
    collect_s: float = 0.0  # trainer core-s from a batch's last file accepted to the update
    groups: int = 2  # groups in the files file_s and validate_s were measured on
    measured_on: str = ""


@dataclass
class Workers:
    """A set of alike workers."""

    count: int
    mbit: float
    speed: float = 1.0  # the reference device's speed times this (its own device)
    cores: float = 1.0  # the share of a core it may use on a shared machine
    join_step: int = 0  # it joins when the trainer reaches this step


@dataclass
class Swarm:
    workers: list[Workers]
    steps: int = 12
    batch_groups: int = 16
    groups_per_file: int = 2
    async_level: int = 2
    max_pending_groups: int = 0  # 0: batch_groups
    work_slack_steps: int = 1  # orchestrator.work_slack_steps (assign = "slack")
    assign: str = "pipelined"  # orchestrator.assign: "pipelined" or "slack"
    relays: list[int] = field(default_factory=lambda: [1])  # relays per level
    relay_mbit: float = 100.0
    origin_mbit: float = 100.0
    validators: int = 1
    validator_mbit: float = 100.0
    sample_rate: float = 0.1
    heartbeat_s: float = 2.0
    ask_poll_s: float = 0.2  # worker.poll_s: the first wait before asking again (AskPacer)
    validator_poll_s: float = 0.0  # validator.poll_s: an idle validator looks for files
    host_cores: float | None = None  # all compute on one machine of this many cores
    weights: dict[str, float] = field(default_factory=dict)  # role -> cpu.shares
    churn: list[tuple[int, float, float]] = field(default_factory=list)  # step, share, down s
    orchestrator_down: tuple[int, float] | None = None  # step, seconds
    seed: int = 0


@dataclass
class Outcome:
    steps: int
    wall_s: float
    trainer_busy_fraction: float
    trainer_idle_s: float
    step_s_p50: float
    files: dict[str, int]
    stale_fraction: float
    weights_lag_s: dict[str, dict[str, float]]
    origin_mb: float
    delivered_mb: float
    validator_use: float
    validator_backlog_max: int
    orchestrator_requests_per_s: float
    orchestrator_core_use: float
    staleness_histogram: dict[str, int]
    cpu_s: dict[str, float] = field(default_factory=dict)  # shared machine: by role and task
    worker_wait_s: dict[str, float] = field(default_factory=dict)  # worker-s told to wait, why

    def as_dict(self) -> dict:
        return dict(self.__dict__)
