"""One DiLoCo site of `swarmrl diloco`: a tiny Llama trained on its shard of the corpus.

Rounds of `diloco.inner_steps` AdamW steps alternate with syncs (outer.py). A
site is one process here (its manager's replica group has one rank); the site
index picks the shard, so a site that dies and is started again trains on the
same lines. Each committed sync appends a row to metrics-site<k>.jsonl: the
outer step, who took part, the held-out loss of the new global weights (the same
on every site, which the tests use to check the sites agree), bytes sent, and
the seconds spent computing and synchronising.
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from datetime import timedelta
from pathlib import Path

import torch

from swarmrl.apps.pretrain.corpus import held_out, site_shard
from swarmrl.config.diloco import DilocoConfig
from swarmrl.config.pretrain import PretrainConfig
from swarmrl.diloco.checkpoint import AsyncCheckpointer
from swarmrl.diloco.outer import OuterLoop

log = logging.getLogger("swarmrl.diloco")


def lm_loss(model, batch: torch.Tensor) -> torch.Tensor:
    logits = model(input_ids=batch[:, :-1]).logits
    return torch.nn.functional.cross_entropy(
        logits.reshape(-1, logits.size(-1)).float(), batch[:, 1:].reshape(-1)
    )


@torch.no_grad()
def eval_loss(model, batches: list[torch.Tensor]) -> float:
    model.eval()
    total = sum(lm_loss(model, b).item() * b.size(0) for b in batches)
    model.train()
    return total / sum(b.size(0) for b in batches)


def inner_lr(cfg: PretrainConfig, step: int) -> float:
    """Linear warm-up, then cosine decay to min_lr_ratio · lr at the run's last inner step."""
    i, total = cfg.inner, cfg.outer_steps * cfg.diloco.inner_steps
    if step < i.warmup_steps:
        return i.lr * (step + 1) / i.warmup_steps
    progress = min(1.0, (step - i.warmup_steps) / max(1, total - i.warmup_steps))
    return i.lr * (i.min_lr_ratio + (1 - i.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))


def make_manager(d: DilocoConfig, site: int, lighthouse: str):
    """A torchft Manager for site `site` (a replica group of one rank), and its store."""
    from torch.distributed import TCPStore
    from torchft import Manager, ProcessGroupGloo
    from torchft.checkpointing.http_transport import HTTPTransport

    class Transport(HTTPTransport):
        """torchft's recovery server, advertised at `diloco.host` (it advertises the
        machine's host name otherwise)."""

        def address(self) -> str:
            return f"http://{d.host}:{self._server.socket.getsockname()[1]}/checkpoint/"

    timeout = timedelta(seconds=d.timeout_s)
    store = TCPStore(d.host, 0, is_master=True, wait_for_workers=False)
    manager = Manager(
        checkpoint_transport=Transport(timeout=timeout, num_chunks=0),
        pg=ProcessGroupGloo(timeout=timeout),
        load_state_dict=None,
        state_dict=None,
        min_replica_size=d.min_sites,
        use_async_quorum=False,
        timeout=timeout,
        quorum_timeout=timedelta(seconds=d.quorum_timeout_s),
        rank=0,
        world_size=1,
        store_addr=d.host,
        store_port=store.port,
        lighthouse_addr=lighthouse,
        replica_id=f"site{site}",
        hostname=d.host,
    )
    return manager, store


class DyingGroup:
    """Fault injection: forwards the alltoall of the pseudo-gradient all-reduce, then
    kills this process before the allgather, so the other sites fail mid-collective."""

    def __init__(self, pg):
        self.pg = pg

    def __getattr__(self, name):
        return getattr(self.pg, name)

    def allgather(self, *args):
        log.warning("fault injection: dying in the middle of the all-reduce")
        logging.shutdown()
        os._exit(17)


def build_site(cfg: PretrainConfig, site: int):
    """Model (the same initial weights on every site), shard, held-out batches, inner
    optimizer and data generator of site `site` of `cfg.sites`."""
    from swarmrl.models.tiny import build_char_tokenizer, build_tiny_model

    tok = build_char_tokenizer()
    model = build_tiny_model(tok, hidden=cfg.model.hidden, layers=cfg.model.layers, seed=cfg.seed)
    c = cfg.corpus
    shard = site_shard(tok, c.lines, cfg.seed, site, cfg.sites, c.seq_len)
    evals = held_out(tok, c.eval_lines, cfg.seed, c.seq_len).eval_batches(c.batch)
    inner = torch.optim.AdamW(
        model.parameters(), lr=cfg.inner.lr, weight_decay=cfg.inner.weight_decay
    )
    gen = torch.Generator().manual_seed(cfg.seed * 1000 + site)
    return model, shard, evals, inner, gen


def site_state(outer: OuterLoop, inner, gen: torch.Generator, manager) -> dict:
    """What a site needs to go on after a restart (the model equals the global weights
    right after a committed sync, when checkpoints are taken)."""
    return {
        "outer": outer.state_dict(),
        "inner_opt": inner.state_dict(),
        "generator": gen.get_state(),
        "manager": manager.state_dict(),
    }


def resume_site(ckpt: AsyncCheckpointer, outer: OuterLoop, inner, gen, manager, site: int) -> None:
    found = ckpt.latest()
    if found is None:
        log.info("site %d: no checkpoint to resume from; it recovers from a live peer", site)
        return
    step, path = found
    sd = torch.load(path, weights_only=False)  # our own file, written by this site
    outer.restore(sd["outer"])
    inner.load_state_dict(sd["inner_opt"])
    gen.set_state(sd["generator"])
    manager.load_state_dict(sd["manager"])
    log.info("site %d: resumed from %s (outer step %d)", site, path, step)


def run_site(
    cfg: PretrainConfig,
    run: Path,
    site: int,
    lighthouse: str,
    fail_in_sync: int = 0,
    resume: bool = False,
) -> int:
    torch.set_num_threads(cfg.threads)
    model, shard, evals, inner, gen = build_site(cfg, site)
    c = cfg.corpus
    manager, _store = make_manager(cfg.diloco, site, lighthouse)
    outer = OuterLoop(model, cfg.diloco, manager)
    metrics = run / f"metrics-site{site}.jsonl"
    ckpt = AsyncCheckpointer(run / "checkpoints" / f"site{site}", cfg.keep_checkpoints)
    if resume:
        resume_site(ckpt, outer, inner, gen, manager, site)
    has_delta, failures, compute_s, inner_loss = False, 0, 0.0, None
    log.info("site %d: %d parameters, shard of %d tokens, lighthouse %s", site,
             sum(p.numel() for p in model.parameters()), shard.tokens.numel(), lighthouse)  # fmt: skip
    try:
        while True:
            dying = fail_in_sync and outer.outer_steps + 1 == fail_in_sync and has_delta
            res = outer.sync(has_delta, wrap=DyingGroup if dying else None)
            if not res.committed:
                failures += 1
                log.warning(
                    "site %d: sync not committed (%s), attempt %d", site, res.error, failures
                )
                if failures > cfg.diloco.max_retries:
                    log.warning("site %d: dropping this round's inner steps", site)
                    outer.reset_local()
                    has_delta, failures = False, 0
                continue
            if res.healed:
                log.info(
                    "site %d: recovered from a live peer at outer step %d", site, outer.outer_steps
                )
            failures = 0
            row = {
                "site": site, "outer_step": outer.outer_steps, "sites": res.sites,
                "contributors": res.contributors, "contributed": has_delta, "healed": res.healed,
                "bytes_sent": res.bytes_sent, "sync_s": round(res.seconds, 4),
                "compute_s": round(compute_s, 4), "inner_loss": inner_loss,
                "eval_loss": eval_loss(model, evals), "time": time.time(),
            }  # fmt: skip
            with metrics.open("a") as f:
                f.write(json.dumps(row) + "\n")
            log.info("site %d: outer step %d, %d/%d sites contributed, eval loss %.4f",
                     site, outer.outer_steps, res.contributors, res.sites, row["eval_loss"])  # fmt: skip
            done = outer.outer_steps >= cfg.outer_steps
            every = cfg.checkpoint_every
            if every and res.contributors and (outer.outer_steps % every == 0 or done):
                ckpt.save(outer.outer_steps, site_state(outer, inner, gen, manager))
            if done:
                ckpt.wait()
                return 0
            t0, losses = time.monotonic(), []
            for h in range(cfg.diloco.inner_steps):
                lr = inner_lr(cfg, (outer.outer_steps) * cfg.diloco.inner_steps + h)
                for group in inner.param_groups:
                    group["lr"] = lr
                loss = lm_loss(model, shard.batch(gen, c.batch))
                loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.inner.grad_clip)
                inner.step()
                inner.zero_grad(set_to_none=True)
                losses.append(loss.item())
            compute_s, inner_loss = time.monotonic() - t0, sum(losses) / len(losses)
            has_delta = True
    finally:
        manager.shutdown(wait=False)
