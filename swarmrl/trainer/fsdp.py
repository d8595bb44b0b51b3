"""The GRPO update across the ranks of one site: torch.distributed and FSDP2.

Started by torchrun (WORLD_SIZE > 1), a rank joins the default process group
(NCCL when its `trainer.device` is CUDA, gloo on the CPU) and shards the policy
with FSDP2 over a mesh of that device type:
each decoder layer, then the root (the embeddings, tied or not, and the final
norm). `grpo_update(..., rank, world)` runs this rank's share of every
mini-batch (trainer/step.py); FSDP2's gradient divide factor is 1, so the
reduce-scatter sums the ranks' gradients, which is the one-rank gradient
because the loss is a token sum over a constant budget.

The trainer runs on it with `trainer.ranks` > 1 (trainer/ranks.py: rank 0
talks to the orchestrator and publishes the gathered weights, the others
follow). `save_checkpoint`/`load_checkpoint` keep model and optimizer in one
DCP checkpoint; the trainer saves only the optimizer that way
(trainer/ranks.py), because its weights are the published version.
"""

from __future__ import annotations

import os

import torch


def init_distributed(device: torch.device) -> tuple[int, int]:
    """(rank, world) from torchrun's environment; (0, 1) when it is not set. A rank
    on a CUDA `device` (swarmrl/device.py gives each rank its LOCAL_RANK's) joins with
    NCCL, a CPU rank with gloo."""
    if device.type == "cuda":
        torch.cuda.set_device(device)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world == 1:
        return 0, 1
    import torch.distributed as dist

    if device.type == "cuda":
        dist.init_process_group("nccl", device_id=device)
    else:
        dist.init_process_group("gloo")
    return dist.get_rank(), dist.get_world_size()


def leave_distributed(clean: bool = True) -> None:
    """Leave the process group (when there is one). After a `clean` finish every rank
    first meets the others at a barrier, so that no rank tears its group down while
    another still talks to it (with MASTER_ADDR alone, rank 0 also hosts the store): a
    rank of the two-rank test once died at exit with "terminate called without an
    active exception". After an error there is no barrier: the others may never come.
    The trainer's ranks call it as soon as rank 0 says the run is over (ranks.py), not
    after rank 0's finishing work, which could outlast the barrier's timeout."""
    import torch.distributed as dist

    if not dist.is_initialized():
        return
    if clean:
        dist.barrier()
    dist.destroy_process_group()


def exit_after_leaving(code: int = 0) -> None:
    """End a process that left its group cleanly without the interpreter's finalization:
    gloo's C++ threads can still hold objects at that point, and a rank of the two-rank
    test aborted there now and then ("terminate called without an active exception",
    after destroy_process_group had returned and every result was written). Logs and
    standard streams are flushed first; nothing else is left to run."""
    import logging
    import os
    import sys

    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os._exit(code)


def decoder_layers(model) -> list[torch.nn.Module]:
    inner = getattr(model, "model", None)
    layers = getattr(inner, "layers", None)
    if layers is None:
        raise ValueError(
            f"{type(model).__name__}: no model.layers to shard (a causal LM is expected)"
        )
    return list(layers)


def shard(model, device: torch.device):
    """FSDP2 over all ranks on `device`'s type: each decoder layer, then the root."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    for layer in decoder_layers(model):
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    for module in [*decoder_layers(model), model]:  # each sharded module has its own setting
        module.set_gradient_divide_factor(1.0)
        module.set_force_sum_reduction_for_comms(True)  # gloo has no pre-multiplied sum
    return model


def full_state_dict(model) -> dict[str, torch.Tensor]:
    """The unsharded weights on the CPU (a collective: every rank calls it)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(
        model, options=StateDictOptions(full_state_dict=True, cpu_offload=True)
    )


def save_checkpoint(model, optimizer, path) -> None:
    """A DCP checkpoint of the (sharded) model and optimizer: each rank writes its
    shards; any number of ranks, one included, can load it (a collective)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_sd, optim_sd = get_state_dict(model, optimizer)
    dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=str(path))


def load_checkpoint(model, optimizer, path) -> None:
    """Load a DCP checkpoint written with any number of ranks into this layout."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    model_sd, optim_sd = get_state_dict(model, optimizer)
    state = {"model": model_sd, "optim": optim_sd}
    dcp.load(state, checkpoint_id=str(path))
    set_state_dict(
        model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"]
    )
