"""The DiLoCo outer loop on torchft: quorum, live recovery, the 8-bit average, the outer step.

torchft does membership and recovery. A `Manager` per site heartbeats to the
lighthouse; `start_quorum()` (synchronous here) forms the group of sites present
and reconfigures the gloo process group over them; a site behind the others is
healed from a live peer over HTTP with the state registered below: the global
weights, the outer optimizer and the outer-step count. `should_commit()` lets the
sites agree that a sync succeeded. torchft's own `DiLoCo` wrapper is not used:
its quantized all-reduce needs Triton (on CPU it sends fp32), and a joiner in
it sends a pseudo-gradient measured from weights it did not start from.

One sync (`OuterLoop.sync`):
1. quorum; a site healed in it has no pseudo-gradient of its own;
2. an fp32 all-reduce of one number counts the sites that have one, so the
   average divides by contributors only: a joiner sends zeros and does not
   dilute it;
3. pseudo-gradient = global − local weights, averaged over the group in 8 bits
   (allreduce.py) or fp32 (`diloco.bits = 32`);
4. if every site agrees, outer SGD (Nesterov) steps the global weights, which
   are held in fp32 on the CPU; the model restarts its inner steps from them.
A collective that fails (a site died mid-sync) is reported to the manager;
`should_commit` is then false everywhere, nothing changes, and the caller
retries with the same local weights in a new quorum without the dead site.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import torch

from swarmrl.config.diloco import DilocoConfig
from swarmrl.diloco.allreduce import allreduce_fp32, allreduce_int8, wire_bytes_int8

log = logging.getLogger(__name__)


@dataclass
class SyncResult:
    committed: bool
    sites: int  # in the quorum
    contributors: int  # with a pseudo-gradient of their own
    healed: bool  # this site took its state from a peer in this quorum
    bytes_sent: int  # pseudo-gradient bytes this site handed the transport
    seconds: float
    error: str = ""


class OuterLoop:
    def __init__(self, model: torch.nn.Module, cfg: DilocoConfig, manager):
        self.model = model
        self.cfg = cfg
        self.manager = manager
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.global_params = [
            torch.nn.Parameter(p.detach().float().cpu().clone()) for p in self.params
        ]
        self.outer_opt = torch.optim.SGD(
            self.global_params,
            lr=cfg.outer_lr,
            momentum=cfg.outer_momentum,
            nesterov=cfg.outer_momentum > 0,
        )
        self.outer_steps = 0
        self._healed = False
        manager.register_state_dict_fn("diloco", self.load_state_dict, self.state_dict)

    # -- state a joiner receives from a live peer ---------------------------
    def state_dict(self) -> dict:
        return {
            "global": [g.detach() for g in self.global_params],
            "outer_opt": self.outer_opt.state_dict(),
            "outer_steps": self.outer_steps,
        }

    def load_state_dict(self, sd: dict) -> None:
        """State from a live peer (torchft calls this while healing this site)."""
        self.restore(sd)
        self._healed = True

    def restore(self, sd: dict, reset: bool = True) -> None:
        """State from a peer or a checkpoint; the model restarts from the global weights
        (`reset`), or keeps its own (a resumed trainer mid-round)."""
        with torch.no_grad():
            for g, v in zip(self.global_params, sd["global"], strict=True):
                g.copy_(v)
        self.outer_opt.load_state_dict(sd["outer_opt"])
        self.outer_steps = int(sd["outer_steps"])
        if reset:
            self.reset_local()

    def reset_local(self) -> None:
        """Local weights := global weights (the start of a round of inner steps)."""
        with torch.no_grad():
            for p, g in zip(self.params, self.global_params, strict=True):
                p.copy_(g.to(p.dtype))

    # -- one synchronisation -----------------------------------------------
    def _pseudo_gradient(self) -> torch.Tensor:
        with torch.no_grad():
            return torch.cat(
                [(g - p.detach().float().cpu()).view(-1)
                 for g, p in zip(self.global_params, self.params, strict=True)]
            )  # fmt: skip

    def sync(self, has_delta: bool, wrap=None) -> SyncResult:
        """One attempt to synchronise; `wrap` wraps the process group (fault injection)."""
        t0 = time.monotonic()
        self._healed = False
        self.manager.start_quorum()
        healed = self._healed
        if healed:
            has_delta = False  # our inner steps started from weights the others never had
        sites = self.manager.num_participants()
        pg = self.manager._pg  # the group torchft reconfigured for this quorum
        pg = wrap(pg) if wrap else pg
        contributors, sent, error = 0, 0, ""
        average = None
        try:
            if self.manager.errored() is not None:
                raise RuntimeError(f"quorum failed: {self.manager.errored()}")
            flag = torch.tensor([1.0 if has_delta else 0.0])
            contributors = int(allreduce_fp32(pg, flag, 1.0).item())
            if contributors:
                n = sum(g.numel() for g in self.global_params)
                delta = self._pseudo_gradient() if has_delta else torch.zeros(n)
                if self.cfg.bits == 8:
                    average = allreduce_int8(pg, delta, sites, contributors, self.cfg.block)
                    sent = wire_bytes_int8(n, sites, self.cfg.block)
                else:
                    average = allreduce_fp32(pg, delta, contributors)
                    sent = 2 * (sites - 1) * 4 * n // max(sites, 1)
        except Exception as e:  # a peer died mid-sync: no step anywhere, retried by the caller
            error = f"{type(e).__name__}: {e}"
            log.warning("sync failed (%s); the step is not committed", error)
            self.manager.report_error(e)
        committed = self.manager.should_commit()
        if committed and average is not None:
            offset = 0
            for g in self.global_params:
                g.grad = average[offset : offset + g.numel()].view_as(g).clone()
                offset += g.numel()
            self.outer_opt.step()
            self.outer_opt.zero_grad(set_to_none=True)
            self.outer_steps += 1
        if committed:
            self.reset_local()
        return SyncResult(
            committed, sites, contributors, healed, sent, time.monotonic() - t0, error
        )
