"""`swarmrl init-model`: build the built-in tiny model and warm-start it.

The model and its character tokenizer come from models/tiny.py. The warm
start (warm_start.py) is a supervised pass on generated problems of the task
(prompt + "\n" -> answer + EOS, loss on the answer only) until the sampled
reward at the run's temperature lies in a target band. This module joins the
two and saves a normal HF directory (config, safetensors, tokenizer) with a
manifest, so the result loads like any other model and is version 0 of a
run. `warm_start.json` beside the weights records the measured starting
reward and how it was measured.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

from swarmrl.apps.warm_start import Band, WarmStartResult, warm_start
from swarmrl.config import SamplingConfig, TaskConfig
from swarmrl.models.tiny import build_char_tokenizer, build_tiny_model

log = logging.getLogger("swarmrl.models.tiny")  # log lines name the model they build
WARM_START_FILE = "warm_start.json"
BAND_ARGS_ERROR = "error: --target must be in (0, 1) and --tolerance in (0, 0.5)"


def band_args_ok(target: float, tolerance: float) -> bool:
    """Whether `--target` and `--tolerance` describe a band the warm start can stop in."""
    return 0.0 < target < 1.0 and 0.0 < tolerance < 0.5


def init_model(
    task_cfg: TaskConfig,
    sampling: SamplingConfig,
    out: Path,
    band: Band | None = None,
    max_steps: int = 3000,
    batch: int = 64,
    lr: float = 2e-3,
    hidden: int = 192,
    layers: int = 4,
    seed: int = 0,
    threads: int = 1,
) -> WarmStartResult:
    """Build the tiny model, warm-start it on task `task_cfg.name`, and save it in `out`."""
    import torch

    from swarmrl.protocol.manifest import write_json_atomic, write_manifest

    torch.set_num_threads(threads)
    torch.manual_seed(seed)
    t0 = time.time()
    tok = build_char_tokenizer()
    model = build_tiny_model(tok, hidden=hidden, layers=layers, seed=seed)
    n_params = sum(p.numel() for p in model.parameters())
    log.info("tiny model: %.2fM parameters, vocab %d", n_params / 1e6, len(tok))
    result = warm_start(
        model, tok, task_cfg, sampling, band or Band(), max_steps, batch, lr, seed, threads=threads
    )
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
    write_json_atomic(out / WARM_START_FILE, result.to_json() | {"task": task_cfg.model_dump()})
    write_manifest(out, version=0)
    log.info(
        "saved %s: %d warm-start steps, sampled reward %.3f at temperature %g (%s band %.2f-%.2f), "
        "%.1fs",
        out, result.steps, result.sampled_reward, result.temperature,
        "inside the" if result.in_band else "OUTSIDE the", *result.band, time.time() - t0,
    )  # fmt: skip
    return result


def summary_line(out: str, res: WarmStartResult) -> str:
    """The line `init-model` prints: where the starting reward landed, and what it took."""
    where = "inside" if res.in_band else "OUTSIDE"
    return (
        f"{out}: starting sampled reward {res.sampled_reward:.3f} at temperature "
        f"{res.temperature:g} ({where} the band {res.band[0]:.2f}-{res.band[1]:.2f}), "
        f"{res.steps} warm-start steps, {res.seconds:.0f}s"
    )
