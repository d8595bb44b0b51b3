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
so a run saved with R ranks resumes with any other number. The model is in
them only when versions are published in a lower precision than the master
weights (`model.publish_dtype` bfloat16 over float32 masters): otherwise the
published version of the same step is the model.

With `trainer.lora` (one rank only) the model is the base wrapped with peft
adapters, AdamW takes the adapters alone, and versions after 0 are the adapter
alone (trainer/lora.py); a resumed adapter version is loaded over `model.path`.

Master and published weights: the trainer's parameters, gradients and AdamW
state stay in `model.dtype` (float32); `snapshot` rounds a copy to the publish
dtype (`publish_dtype`: bfloat16 where the trainer is on CUDA unless set), which
workers and validators then run.
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
from swarmrl.shardcast.adapter import ADAPTER_CONFIG
from swarmrl.trainer import lora
from swarmrl.trainer.fsdp import full_state_dict, leave_distributed, shard
from swarmrl.trainer.step import StepStats, grpo_update, set_lr

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
    publish: torch.dtype = torch.float32  # the dtype versions are published in
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
        lc = cfg.trainer.lora
        adapter = lc.rank and model_path and (Path(model_path) / ADAPTER_CONFIG).exists()
        # an adapter version is resumed over the base it adapts: model.path
        model = load_model(cfg.model.path if adapter else model_path, cfg.model.dtype)
        self.publish = publish_dtype(cfg, self.device)
        first = None
        if self.rank == 0:
            first = {k: self._published(v) for k, v in model.state_dict().items()}
        if lc.rank:  # trainer/lora.py: the base frozen, the adapters trained
            model = lora.wrap(model, lc)
            if adapter:
                lora.load_adapter(model, model_path)
        self.model = model.to(self.device)
        if self.world > 1:
            self.aliases = _aliases(self.model)
            shard(self.model, self.device)
        if cfg.trainer.kl_coef > 0:
            self.ref_model = load_model(cfg.model.path, cfg.model.dtype).to(self.device)
        self.optimizer = adamw(lora.trainable(self.model), cfg.trainer)
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
        return self.update(step, samples)

    def update(self, step: int, samples) -> StepStats:
        set_lr(self.optimizer, self.cfg.trainer, step)
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
        """A CPU copy of the full weights on rank 0 in the publish dtype, to publish (a
        collective). The master weights stay as they are."""
        if self.world == 1:
            state = self.model.state_dict()
            if lora.is_lora(self.model):  # the version is the adapter alone
                state = lora.adapter_state(self.model)
            return {k: self._published(v) for k, v in state.items()}
        full = full_state_dict(self.model)  # a collective
        if self.rank != 0:
            return None
        return {k: self._published(v) for k, v in full.items() if k not in self.aliases}

    def publish_rounds(self) -> bool:
        """Whether published versions round the master weights (then the optimizer
        checkpoint keeps the masters for --resume)."""
        return any(p.dtype != self.publish for p in self.model.parameters())

    def _published(self, v: torch.Tensor) -> torch.Tensor:
        """A CPU copy of `v`, floating tensors in the publish dtype (rounded to nearest)."""
        dtype = self.publish if v.is_floating_point() else v.dtype
        return v.detach().to("cpu", dtype=dtype, copy=True)

    def save(self, paths: RunPaths, step: int) -> Path:
        """The optimizer checkpoint of `step` (a collective); complete once it returns."""
        final = optimizer_dir(paths, step)
        tmp = final.with_name(final.name + ".tmp")
        if self.rank == 0:
            shutil.rmtree(tmp, ignore_errors=True)
        if self.world > 1:
            torch.distributed.barrier()
        save_optimizer(self.model, self.optimizer, tmp, masters=self.publish_rounds())
        if self.rank == 0:
            shutil.rmtree(final, ignore_errors=True)
            tmp.rename(final)
        return final

    def stop(self) -> None:
        """Tell the other ranks the run is over; every rank leaves together (fsdp.py:
        leave_distributed) before rank 0 goes on to its own finishing work."""
        if self.world > 1 and self.rank == 0:
            _broadcast(None, 0)
            leave_distributed()


def publish_dtype(cfg: RunConfig, device: torch.device) -> torch.dtype:
    """`model.publish_dtype` for a trainer on `device`: auto is bfloat16 on CUDA (what
    GPU inference runs), else the master weights' `model.dtype`."""
    name = cfg.model.publish_dtype
    if name == "auto":
        name = "bfloat16" if device.type == "cuda" else cfg.model.dtype
    return getattr(torch, name)


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


def _masters(model) -> dict:
    """The master weights to checkpoint: the trained ones (all of them without LoRA,
    whose frozen base is model.path's and is not saved again)."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    state = get_model_state_dict(model)
    trained = {n for n, p in model.named_parameters(remove_duplicate=False) if p.requires_grad}
    if len(trained) == len(list(model.named_parameters(remove_duplicate=False))):
        return state
    return {k: v for k, v in state.items() if k in trained}


def save_optimizer(model, optimizer, path: Path, masters: bool = False) -> None:
    """The optimizer's state as a DCP checkpoint (a collective); with `masters`, the
    model's weights too: they are the master weights when versions are published in
    a lower precision, and the published version cannot restore them."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (
        get_optimizer_state_dict,
    )

    state = {"optim": get_optimizer_state_dict(model, optimizer)}
    if masters:  # frozen weights (LoRA's base) are model.path's: not saved again
        state["model"] = _masters(model)
    with warnings.catch_warnings():  # one process without a group: what we mean
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        dcp.save(state, checkpoint_id=str(path))


def load_optimizer(model, optimizer, path) -> None:
    """Load an optimizer checkpoint written by any number of ranks (a collective), and
    the master weights when it holds them."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_optimizer_state_dict,
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    state = {"optim": get_optimizer_state_dict(model, optimizer)}
    keys = dcp.FileSystemReader(str(path)).read_metadata().state_dict_metadata
    masters = any(k.startswith("model.") for k in keys)
    if masters:
        state["model"] = _masters(model)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        dcp.load(state, checkpoint_id=str(path))
    set_optimizer_state_dict(model, optimizer, optim_state_dict=state["optim"])
    if masters:
        frozen = any(not p.requires_grad for p in model.parameters())  # LoRA: adapters only
        set_model_state_dict(model, state["model"], options=StateDictOptions(strict=not frozen))


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
        policy.update(step, samples)
        policy.snapshot()
        policy.save(paths, step)
    leave_distributed()  # with rank 0, in its stop()
    log.info("rank %d: the run is over", rank)
