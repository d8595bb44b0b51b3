"""What the trainer shares after each step besides metrics.jsonl: the row to the
orchestrator (its dashboard) and to the experiment trackers, with the per-node figures
of the orchestrator's swarm view. A refused or lost report loses a view, not the run."""

from __future__ import annotations

import logging
import math

from swarmrl.config import RunConfig
from swarmrl.protocol.client import OrchestratorClient, OrchestratorError
from swarmrl.tracking import Tracker, node_scalars, scalars

log = logging.getLogger("swarmrl.trainer")


def share_row(cfg: RunConfig, client: OrchestratorClient, tracker: Tracker, row: dict) -> None:
    """The step's row to the orchestrator (its dashboard) and to the trackers, with the
    ledger's per-node figures; a refused or lost report loses a view, not the run."""
    step = row["step"]
    finite = {
        k: v if not isinstance(v, float) or math.isfinite(v) else None for k, v in row.items()
    }
    try:
        client.call("POST", "/v1/trainer/metrics", {"step": step, "row": finite})
    except (OrchestratorError, ConnectionError) as e:
        log.warning("step %d: the orchestrator did not take the metrics row: %s", step, e)
    if not tracker.enabled:
        return
    values = scalars(row)
    if cfg.tracking.nodes:  # the swarm view is the ledger with each node's pace and version
        view = "/v1/dashboard/swarm" if cfg.orchestrator.dashboard else "/v1/ledger"
        try:
            values.update(node_scalars(client.call("GET", view)))
        except (OrchestratorError, ConnectionError) as e:
            log.warning("step %d: no per-node figures for the trackers: %s", step, e)
    tracker.log(values, step)
