"""Experiment trackers: TensorBoard event files by default, Weights & Biases when asked.

A tracker only carries what the run already records, under the same names:
each metrics.jsonl row's numbers as they are (`reward`, `loss`, ...), the
held-out evaluations of eval.json (`heldout/start_model/accuracy`, ...), the
per-node figures of the orchestrator's ledger (`node/<key>/accepted`, ...) and
the run's resolved config. The trainer writes the step rows and the node
figures; the launcher writes the held-out scores, before the trainer starts and
after it ends, into the same W&B run (one id per run directory, kept in
`runs/<name>/wandb/run_id`) and the same TensorBoard directory.

Both libraries are imported only when enabled. A tracker that cannot start
(W&B online without a login, a package missing) is an error at start that
names the setting, not a silent gap in the figures.
"""

from __future__ import annotations

import json
import logging
import math
import secrets

from swarmrl.config import RunConfig
from swarmrl.errors import ConfigError

log = logging.getLogger("swarmrl.tracking")

# the per-node figures a tracker carries: the ledger's (orchestrator/work.py, `ledger`), and
# with the dashboard on, its measured pace and how many versions behind it heartbeats
NODE_FIGURES = ("accepted", "rejected", "pending", "stake", "slashed", "kl_unchecked",
                "kl_checked", "s_per_unit", "behind")  # fmt: skip


def scalars(row: dict, prefix: str = "") -> dict[str, float]:
    """The finite numbers of a row (booleans as 0/1), named `prefix + key`."""
    out = {}
    for k, v in row.items():
        if isinstance(v, bool):
            out[prefix + k] = float(v)
        elif isinstance(v, int | float) and math.isfinite(v):
            out[prefix + k] = float(v)
    return out


def node_scalars(ledger: dict) -> dict[str, float]:
    """Per-node figures of a ledger or of the dashboard's swarm view (`node/<first 12 hex
    of the key>/<figure>`): workers only, as they are the nodes whose work is counted."""
    out = {}
    for n in ledger.get("nodes", []):
        if n.get("role") != "worker":
            continue
        figures = {k: n.get(k) for k in NODE_FIGURES}
        out.update(scalars(figures, f"node/{n['key'][:12]}/"))
    return out


def heldout_scalars(evaluations: dict) -> dict[str, float]:
    """eval.json's scores: `heldout/<which>/<figure>` (accuracy, mean reward, ...)."""
    out = {}
    for which, res in evaluations.items():
        if isinstance(res, dict):
            out.update(scalars(res, f"heldout/{which}/"))
    return out


class Tracker:
    """The trackers `cfg.tracking` enables, for one process (`who`: trainer, launcher)."""

    def __init__(self, cfg: RunConfig, who: str):
        self.cfg = cfg
        self.who = who
        self.tb = None
        self.wandb_run = None
        t = cfg.tracking
        paths = cfg.paths
        if t.tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError as e:  # torch's writer needs the tensorboard package
                raise ConfigError(
                    f"tracking.tensorboard = true needs the tensorboard package ({e}); "
                    "pip install tensorboard, or set tracking.tensorboard = false"
                ) from None
            paths.tensorboard.mkdir(parents=True, exist_ok=True)
            self.tb = SummaryWriter(log_dir=str(paths.tensorboard), filename_suffix=f".{who}")
        if t.wandb != "off":
            self.wandb_run = _start_wandb(cfg, who)

    @property
    def enabled(self) -> bool:
        return self.tb is not None or self.wandb_run is not None

    def config(self) -> None:
        """The resolved config, once (W&B takes it at init)."""
        if self.tb is not None:
            text = json.dumps(self.cfg.model_dump(mode="json"), indent=2)
            self.tb.add_text("config", "```\n" + text + "\n```", 0)

    def log(self, values: dict[str, float], step: int, wall_time: float | None = None) -> None:
        if not values:
            return
        if self.tb is not None:
            for k, v in values.items():
                self.tb.add_scalar(k, v, step, walltime=wall_time)
            self.tb.flush()
        if self.wandb_run is not None:
            self.wandb_run.log(values, step=step)

    def close(self) -> None:
        if self.tb is not None:
            self.tb.close()
            self.tb = None
        if self.wandb_run is not None:
            self.wandb_run.finish()
            self.wandb_run = None


def locations(cfg: RunConfig) -> list[str]:
    """Where the trackers put the run's figures, for the launcher's summary."""
    t, paths = cfg.tracking, cfg.paths
    out = []
    if t.tensorboard:
        out.append(f"TensorBoard: tensorboard --logdir {paths.tensorboard}")
    if t.wandb == "offline":
        out.append(f"W&B offline runs: wandb sync {paths.wandb}/offline-run-*")
    elif t.wandb == "online":
        entity = f"{t.wandb_entity}/" if t.wandb_entity else ""
        out.append(f"W&B: project {entity}{t.wandb_project}, run {wandb_run_id(cfg)}")
    return out


def wandb_run_id(cfg: RunConfig) -> str:
    """The run's W&B id, made once per run directory, so that the launcher's and the
    trainer's figures (and a resumed trainer's) land in one W&B run."""
    path = cfg.paths.wandb / "run_id"
    if path.exists():
        return path.read_text().strip()
    path.parent.mkdir(parents=True, exist_ok=True)
    run_id = f"{cfg.name[:40]}-{secrets.token_hex(4)}".lower().replace(".", "-")
    path.write_text(run_id + "\n")
    return run_id


def _start_wandb(cfg: RunConfig, who: str):
    t = cfg.tracking
    try:
        import wandb
    except ImportError:
        raise ConfigError(
            f"tracking.wandb = {t.wandb!r} needs the wandb package: pip install wandb"
        ) from None
    run_id = wandb_run_id(cfg)
    try:
        return wandb.init(
            project=t.wandb_project,
            entity=t.wandb_entity or None,
            name=cfg.name,
            id=run_id,
            resume="allow",
            dir=str(cfg.paths.run),  # W&B adds wandb/
            mode=t.wandb,
            config=cfg.model_dump(mode="json"),
            job_type=who,
            settings=wandb.Settings(silent=True, console="off"),
        )
    except Exception as e:  # wandb raises its own types for login, network and usage
        raise ConfigError(
            f"tracking.wandb = {t.wandb!r}: W&B did not start ({type(e).__name__}: {e}); "
            "log in with `wandb login`, or use tracking.wandb = 'offline'"
        ) from None
