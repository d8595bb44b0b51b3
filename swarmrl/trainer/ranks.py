"""What every rank of the trainer runs: the policy, its update and its checkpoint.

With `trainer.ranks` = 1 this is the whole trainer's model side, in one
process. With more, the launcher starts the trainer under torchrun: rank 0
runs the trainer loop (trainer/loop.py: the orchestrator, the batch, the
curriculum, metrics, publishing), and every other rank runs `follow`, which
mirrors rank 0's collectives one for one:

1. rank 0 broadcasts where to start: the model directory (the resumed
   version's, or `model.path`) and the optimizer checkpoint to load, if any;
   every rank loads the model, shards it (FSDP2, trainer/fsdp.py) and builds
   AdamW, then loads the optimizer state;
2. per step, rank 0 broadcasts (step, samples); every rank runs its share of
   the GRPO update (`step`/`update`), the full state dict is gathered for
   rank 0 to publish (`snapshot`), and every rank writes its part of the
   optimizer checkpoint (`save`);
3. rank 0 broadcasts None: the run is over.

If a rank dies, torchrun stops the others and exits non-zero; the launcher
then ends the run, and `--resume` starts from the newest checkpoint with any
number of ranks.

Optimizer checkpoints are DCP directories (`trainer_state/step_N.optim/`,
written to `.tmp` and renamed by rank 0 once every rank's part is written),
so a run saved with R ranks resumes with any other number. The model is not
in them: it is the published version of the same step.
"""

from __future__ import annotations

import logging
import shutil
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import torch

from swarmrl.config import RunConfig, RunPaths
from swarmrl.models.loading import load_model, load_tokenizer
from swarmrl.trainer.fsdp import full_state_dict, shard
from swarmrl.trainer.step import StepStats, grpo_update

log = logging.getLogger("swarmrl.trainer")


def optimizer_dir(paths: RunPaths, step: int) -> Path:
    return paths.trainer_state / f"step_{step:06d}.optim"


def _broadcast(obj=None, rank: int = 0):
    """Rank 0's `obj` on every rank (pickled: only the trainer's own ranks take part)."""
    import torch.distributed as dist

    box = [obj if rank == 0 else None]
    dist.broadcast_object_list(box, src=0)
    return box[0]


@dataclass
class Policy:
    """The policy, its reference model and its optimizer, as this rank holds them."""

    cfg: RunConfig
    rank: int
    world: int
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    model: object = None
    ref_model: object = None
    optimizer: torch.optim.Optimizer | None = None
    budget: float = 0.0
    pad_id: int = 0
    aliases: set = field(default_factory=set)

    def start(self, model_path: str | None = None, optim_dir: str | None = None) -> dict | None:
        """Load the weights and the optimizer state rank 0 names (a collective). Returns,
        on rank 0, a snapshot of the weights as loaded (to publish as version 0)."""
        if self.world > 1:
            model_path, optim_dir = _broadcast((model_path, optim_dir), self.rank)
        cfg = self.cfg
        self.pad_id = load_tokenizer(cfg.model.path).pad_token_id
        model = load_model(model_path, cfg.model.dtype)
        first = None
        if self.rank == 0:
            first = {k: v.detach().clone() for k, v in model.state_dict().items()}
        self.model = model.to(self.device)
        if self.world > 1:
            self.aliases = _aliases(self.model)
            shard(self.model, self.device)
        if cfg.trainer.kl_coef > 0:
            self.ref_model = load_model(cfg.model.path, cfg.model.dtype).to(self.device)
        self.optimizer = adamw(list(self.model.parameters()), cfg.trainer)
        if optim_dir:
            load_optimizer(self.model, self.optimizer, optim_dir)
        self.budget = (
            cfg.trainer.token_budget
            or cfg.trainer.batch_groups * cfg.worker.group_size * cfg.sampling.max_new_tokens
        )
        return first

    def step(self, step: int, samples) -> StepStats:
        """Rank 0: one update (a collective; the followers' turn of their loop). Then,
        on every rank: `snapshot()`, then `save()`."""
        if self.world > 1:
            _broadcast((step, samples), self.rank)
        return self.update(samples)

    def update(self, samples) -> StepStats:
        return grpo_update(
            self.model,
            self.ref_model,
            self.optimizer,
            samples,
            self.cfg.trainer,
            self.budget,
            self.pad_id,
            self.rank,
            self.world,
            self.cfg.sampling.top_p,
        )

    def snapshot(self) -> dict | None:
        """A CPU copy of the full weights on rank 0, to publish (a collective)."""
        if self.world == 1:
            return {k: v.detach().to("cpu", copy=True) for k, v in self.model.state_dict().items()}
        full = full_state_dict(self.model)  # a collective
        return {k: v for k, v in full.items() if k not in self.aliases} if self.rank == 0 else None

    def save(self, paths: RunPaths, step: int) -> Path:
        """The optimizer checkpoint of `step` (a collective); complete once it returns."""
        final = optimizer_dir(paths, step)
        tmp = final.with_name(final.name + ".tmp")
        if self.rank == 0:
            shutil.rmtree(tmp, ignore_errors=True)
        if self.world > 1:
            torch.distributed.barrier()
        save_optimizer(self.model, self.optimizer, tmp)
        if self.rank == 0:
            shutil.rmtree(final, ignore_errors=True)
            tmp.rename(final)
        return final

    def stop(self) -> None:
        if self.world > 1 and self.rank == 0:
            _broadcast(None, 0)


def _aliases(model) -> set[str]:
    """Names of parameters that are another's tensor (tied embeddings): the gathered
    state dict holds them as copies, `save_pretrained` wants them once."""
    every = {n for n, _ in model.named_parameters(remove_duplicate=False)}
    return every - {n for n, _ in model.named_parameters()}


def adamw(params: list, tc) -> torch.optim.AdamW:
    """The trainer's AdamW: the fused kernel (one pass over all tensors: a third of the
    time of the per-tensor loop on a CPU) where the parameters' device and dtype have
    it, the per-tensor loop where they do not."""
    kw = {"lr": tc.lr, "betas": tc.betas, "weight_decay": tc.weight_decay}
    try:
        return torch.optim.AdamW(params, fused=True, **kw)
    except (RuntimeError, ValueError):  # no fused kernel for this device or dtype
        return torch.optim.AdamW(params, **kw)


def save_optimizer(model, optimizer, path: Path) -> None:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    with warnings.catch_warnings():  # one process without a group: what we mean
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        dcp.save({"optim": get_optimizer_state_dict(model, optimizer)}, checkpoint_id=str(path))


def load_optimizer(model, optimizer, path) -> None:
    """Load an optimizer checkpoint written by any number of ranks (a collective)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (
        get_optimizer_state_dict,
        set_optimizer_state_dict,
    )

    state = {"optim": get_optimizer_state_dict(model, optimizer)}
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        dcp.load(state, checkpoint_id=str(path))
    set_optimizer_state_dict(model, optimizer, optim_state_dict=state["optim"])


def follow(cfg: RunConfig, rank: int, world: int, device: torch.device) -> None:
    """A rank other than 0: mirror rank 0's collectives until it says the run is over."""
    paths = cfg.paths
    policy = Policy(cfg, rank, world, device)
    policy.start()
    log.info("rank %d of %d: policy loaded and sharded", rank, world)
    while True:
        msg = _broadcast(None, rank)
        if msg is None:
            break
        step, samples = msg
        policy.update(samples)
        policy.snapshot()
        policy.save(paths, step)
    log.info("rank %d: the run is over", rank)
