"""DiLoCo for RL: GRPO trainer sites that synchronise their policies (`trainer.diloco`).

Each site is a whole swarm (its own orchestrator, workers, validators, relays;
`swarmrl rl` starts them, launch/diloco_rl.py) whose trainer takes
`trainer.diloco.inner_steps` GRPO steps (AdamW, its own state kept across
syncs) and then joins the same outer loop as `swarmrl diloco`
(diloco/outer.py on torchft): pseudo-gradient = global − local policy,
averaged over the sites present in 8 bits, outer SGD with Nesterov momentum,
the policy reset to the new global weights. The version published after a
sync is the global policy, the same on every site; between syncs each site
publishes its own.

The trainer syncs once when it starts (a site started mid-run is healed from
a live peer there: global weights, outer optimizer, outer-step count) and after
every step that is a multiple of inner_steps. A sync that fails (a site died in
it) is retried in a new quorum up to `max_retries` times, then the round's
inner steps are dropped. The outer state is saved to
`trainer_state/diloco.pt` after each committed sync, so `--resume` keeps it.
One rank per site: under torchrun the sites' ranks would each need a manager.
"""

from __future__ import annotations

import logging
import time

import torch

from swarmrl.config import ConfigError, RunConfig
from swarmrl.diloco.outer import OuterLoop, SyncResult

log = logging.getLogger("swarmrl.trainer")

START_SKEW_S = 30.0  # how long a starting site waits for the others to come up


class PolicySync:
    def __init__(self, cfg: RunConfig, model, world: int):
        d = cfg.trainer.diloco
        if world > 1:
            raise ConfigError("trainer.diloco needs trainer.ranks = 1 (one process per site)")
        if not d.lighthouse:
            raise ConfigError(
                "trainer.diloco.sites is set but trainer.diloco.lighthouse is empty: start "
                "the sites with `swarmrl rl` (it starts a lighthouse) or name one"
            )
        from swarmrl.apps.pretrain.site import make_manager

        self.cfg = d
        self.manager, self._store = make_manager(d, d.site, d.lighthouse)
        self.outer = OuterLoop(model, d, self.manager)
        self.path = cfg.paths.trainer_state / "diloco.pt"
        self.last_sync = 0  # the step of the newest committed sync
        self.bytes_sent = 0

    def resume(self, version: int) -> bool:
        """Outer state from `diloco.pt`, the policy kept as resumed. True if the steps
        since the last sync left a pseudo-gradient to send."""
        if not self.path.exists():
            return False
        sd = torch.load(self.path, weights_only=False, map_location="cpu")
        ahead = int(sd["step"]) > version  # died between a sync and its state file
        self.outer.restore(sd, reset=ahead)  # then the policy is the newer global one
        self.last_sync = min(int(sd["step"]), version)
        log.info("DiLoCo: outer step %d restored (last sync after step %d)",
                 self.outer.outer_steps, int(sd["step"]))  # fmt: skip
        return not ahead and version > self.last_sync

    def join(self, step: int, has_delta: bool) -> SyncResult:
        """The first sync: repeated (each a no-op) until all `sites` are in one quorum or
        START_SKEW_S have passed, so that sites started together sync at the same steps
        from then on (a quorum forms from the sites already heartbeating; a site that
        starts a second late would otherwise meet the others one round behind them).
        A site that joins a running run meets the others at their next sync (the
        lighthouse waits for sites that heartbeat); one that finds them all gone goes
        on alone after START_SKEW_S."""
        deadline = time.monotonic() + min(START_SKEW_S, self.cfg.join_timeout_s)
        res = self.sync(step, has_delta)
        while res.sites < self.cfg.sites and time.monotonic() < deadline:
            time.sleep(1.0)
            res = self.sync(step, False)  # what we had to send went in the first one
        if res.sites < self.cfg.sites:
            log.warning("%d of %d sites joined the first sync; the others join later",
                        res.sites, self.cfg.sites)  # fmt: skip
        return res

    def due(self, step: int) -> bool:
        return step % self.cfg.inner_steps == 0

    def sync(self, step: int, has_delta: bool) -> SyncResult:
        """Synchronise, retrying without a dead site; the policy is then the global one
        (or, after max_retries failures, the last global one: the round is dropped)."""
        t0 = time.monotonic()
        for attempt in range(self.cfg.max_retries + 1):
            res = self.outer.sync(has_delta)
            self.bytes_sent += res.bytes_sent
            if res.committed:
                break
            log.warning("step %d: DiLoCo sync not committed (%s), attempt %d",
                        step, res.error, attempt + 1)  # fmt: skip
        else:
            log.warning("step %d: dropping this round's inner steps", step)
            self.outer.reset_local()
        if res.healed:
            log.info("step %d: recovered the global policy from a live peer (outer step %d)",
                     step, self.outer.outer_steps)  # fmt: skip
        self.last_sync = step
        self._save(step)
        res.seconds = time.monotonic() - t0
        log.info("step %d: DiLoCo outer step %d, %d/%d sites contributed, %.2fs",
                 step, self.outer.outer_steps, res.contributors, res.sites, res.seconds)  # fmt: skip
        return res

    def _save(self, step: int) -> None:
        tmp = self.path.with_suffix(".tmp")
        torch.save({**self.outer.state_dict(), "step": step}, tmp)
        tmp.replace(self.path)

    def close(self) -> None:
        self.manager.shutdown(wait=False)


def sync_row(res: SyncResult | None, outer_steps: int, bytes_sent: int) -> dict:
    """The DiLoCo columns of a metrics row (zeros on a step without a sync)."""
    return {
        "outer_step": outer_steps,
        "synced": res is not None and res.committed,
        "sync_sites": res.sites if res else 0,
        "sync_contributors": res.contributors if res else 0,
        "sync_s": res.seconds if res else 0.0,
        "sync_bytes_total": bytes_sent,
    }
