"""bench/swarm_scale.py's run as the planner (swarmrl/plan/model.py) sees it, and the
planner's figures for it beside the run's own (`--costs`, `--predict`, `--replan`)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
from pathlib import Path

from swarm_layout import LINKS, WEIGHTS


def scenario(a: argparse.Namespace, cfg, layout, costs):
    """This run as the planner's model sees it (plan/model.py): the same workers,
    links, shares and weights, tree, work cap and events; cheaters are left out."""
    from swarmrl.plan.model import Swarm, Workers

    kinds: dict[tuple[float, int], int] = {}
    for i in range(a.workers):
        kind = (float(LINKS[i % len(LINKS)]), 2 if i >= a.workers - a.late else 0)
        kinds[kind] = kinds.get(kind, 0) + 1
    levels = [sum(layout.level(i) == lv for i in range(a.relays)) for lv in range(a.levels)]
    return Swarm(
        workers=[Workers(n, mbit, cores=a.worker_cpu, join_step=j) for (mbit, j), n in kinds.items()],
        steps=a.steps, batch_groups=cfg.trainer.batch_groups,
        groups_per_file=a.groups_per_file, async_level=cfg.async_level,
        max_pending_groups=a.batches_out * cfg.trainer.batch_groups, relays=levels,
        work_slack_steps=cfg.orchestrator.work_slack_steps, assign=cfg.orchestrator.assign,
        relay_mbit=float(layout.links["relay"]), origin_mbit=float(layout.links["trainer"]),
        validators=a.validators, validator_mbit=float(layout.links["validator"]),
        sample_rate=cfg.validator.sample_rate, heartbeat_s=cfg.orchestrator.heartbeat_s,
        validator_poll_s=cfg.validator.poll_s, ask_poll_s=cfg.worker.poll_s,
        host_cores=float(os.cpu_count() or 1), weights={k: float(v) for k, v in WEIGHTS.items()},
        churn=[(3, math.ceil(a.churn * a.workers) / a.workers, 2.0)],
        orchestrator_down=(6, 5.0), seed=a.seed,
    )  # fmt: skip


def planned(a: argparse.Namespace, cfg, layout) -> tuple[dict, dict]:
    """The planner's figures for this run (its costs from --costs), and the costs."""
    from swarmrl.plan.model import Costs, simulate

    costs = Costs(**json.loads(Path(a.costs).read_text()))
    if a.version_mb:  # what this run's versions send (--publish), where the costs' run differed
        costs = dataclasses.replace(costs, version_mb=a.version_mb)
    plan = simulate(scenario(a, cfg, layout, costs), costs)
    return {
        "trainer_busy_fraction": plan.trainer_busy_fraction,
        "weights_lag_p50_s": plan.weights_lag_s.get("nodes", {}).get("p50"),
        "stale_fraction": plan.stale_fraction,
    }, costs.__dict__


def predicted(a: argparse.Namespace, cfg, layout, out: dict) -> dict:
    """The planner's figures for this run, beside the run's own, with their ratio."""
    theirs, costs = planned(a, cfg, layout)
    files = out["files"]
    mine = {
        "trainer_busy_fraction": out["trainer_busy_fraction"],
        "weights_lag_p50_s": out["weights_lag_s"].get("nodes", {}).get("p50"),
        "stale_fraction": round(files["stale"] / files["generated"], 3)
        if files["generated"] else None,
    }  # fmt: skip
    ratio = {k: round(theirs[k] / mine[k], 2) if mine[k] else None for k in mine}
    return {"emulated": mine, "planned": theirs, "planned_over_emulated": ratio,
            "costs": costs}  # fmt: skip
