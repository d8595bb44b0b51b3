"""The trainer's metrics row for a step (docs/reference/metrics.md lists its fields)
and its log line."""

from __future__ import annotations

import logging
import resource
import time

import torch

from swarmrl.config import RunConfig
from swarmrl.trainer.correction import mismatch_metrics

log = logging.getLogger("swarmrl.trainer")


def memory() -> dict:
    """The trainer process's peak resident memory so far (MB), and on CUDA the peak
    memory torch allocated on its device."""
    out = {"peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        out["peak_device_mb"] = round(torch.cuda.max_memory_allocated() / 2**20, 1)
    return out


def metrics_row(cfg: RunConfig, step: int, level: int, next_level: int, batch, stats,
                 train_s: float, carried: int, t_start: float) -> dict:  # fmt: skip
    """The metrics row of `step` (docs/architecture.md lists its fields); warns when too
    few of the groups read carried signal."""
    n = len(batch.samples)
    seq_tokens = sum(len(s.prompt_tokens) + len(s.completion_tokens) for s in batch.samples)
    trained_reward = sum(s.reward for s in batch.samples) / n
    read = batch.read_samples
    outcomes = batch.outcomes
    signal = sum(o.signal for o in outcomes) / len(outcomes) if outcomes else 1.0
    min_signal = cfg.curriculum.min_signal
    if outcomes and signal < min_signal:
        log.warning(
            "step %d: only %.0f%% of the %d groups read carried signal (floor %.0f%%)",
            step, 100 * signal, len(outcomes), 100 * min_signal,
        )  # fmt: skip
    return {
        "step": step,
        "reward": batch.read_reward_sum / read if read else trained_reward,
        "task_reward": batch.read_task_reward_sum / read
        if read
        else sum(s.task_reward for s in batch.samples) / n,
        "reward_trained": trained_reward,
        "length_penalty": sum(s.length_penalty for s in batch.samples) / n,
        "loss": stats.loss,
        "grad_norm": stats.grad_norm,
        "clip_fraction": stats.clip_fraction,
        "entropy": stats.entropy,
        "kl": stats.kl,
        **mismatch_metrics(batch.samples, stats.mismatch, step),
        "staleness": sum(step - s.policy_step for s in batch.samples) / n,
        "samples": n,
        "groups": batch.groups,
        "completion_tokens": stats.tokens,
        "tokens_per_s": seq_tokens / max(train_s, 1e-9),
        "accepted_files": batch.accepted_files,
        "rejected_files": batch.rejected_files,
        "stale_files": batch.stale_files,
        "dropped_groups": batch.dropped_groups,
        "groups_read": len(outcomes),
        "samples_read": read,
        "signal_fraction": signal,
        "solved_groups": sum(o.solved for o in outcomes),
        "failed_groups": sum(o.failed for o in outcomes),
        "level": level,
        "next_level": next_level,
        "stale_groups": batch.stale_groups,
        "carried_groups": carried,
        "wait_s": batch.wait_s,
        "train_s": train_s,
        "elapsed_s": time.time() - t_start,
        **memory(),
    }


def log_step(row: dict) -> None:
    log.info(
        "step %d level %d reward %.3f loss %.4f grad %.3f staleness %.2f samples %d "
        "dropped %d signal %.2f wait %.1fs train %.1fs",
        row["step"], row["level"], row["reward"], row["loss"], row["grad_norm"],
        row["staleness"], row["samples"], row["dropped_groups"], row["signal_fraction"],
        row["wait_s"], row["train_s"],
    )  # fmt: skip
