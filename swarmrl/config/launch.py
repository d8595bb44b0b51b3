"""The `[launcher]` section: what `swarmrl rl` starts on one machine."""

from __future__ import annotations

from pydantic import Field

from swarmrl.config.base import Section


class LauncherConfig(Section):
    """The local swarm started by `swarmrl rl`."""

    workers: int = Field(2, ge=0, le=64, description="Inference worker processes.")
    max_worker_restarts: int = Field(
        3, ge=0, le=1000, description="Restarts of a dead worker before the run fails."
    )
    worker_niceness: int = Field(
        5,
        ge=0,
        le=19,
        description="nice(1) increment meant for worker processes (trainer gets priority); "
        "not applied yet: every process runs at the launcher's priority.",
    )
    trust_own_workers: bool = Field(
        True,
        description="List the launcher's own honest workers in orchestrator.trusted_workers "
        "(no proof of work, probation or range shares). False: every worker joins as a "
        "stranger would, as in an open swarm; the launcher's relays stay trusted.",
    )
    progress_s: float = Field(1.0, gt=0.0, le=600.0, description="Progress refresh period.")
    eval_problems: int = Field(
        256,
        ge=0,
        le=100_000,
        description="Held-out problems on which the summary scores the start and final "
        "policies greedily (0: no held-out check).",
    )
