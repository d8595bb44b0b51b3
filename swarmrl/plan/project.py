"""INTELLECT-2-like runs, projected with the planner (plan/model.py, pipelined steps): a
32B policy, 100 and 1,000 workers of mixed speed on 100 Mbit/s to 1 Gbit/s links, a
relay tree of 3 levels, versions sent as bfloat16 patches or as LoRA adapters at the
ratios measured here, and two staleness bounds. `swarmrl plan --project DIR` writes
DIR/projection.md (a table) and DIR/projection.png (a figure) and returns the rows.

What is measured and what is assumed (none of it ran on a GPU here):

| input | value | source |
| --- | --- | --- |
| version sent, patches | 65.6 GB / 54.1 = 1.21 GB | 32.8e9 parameters in bfloat16; full / patch measured on a bfloat16 SmolLM2 run at the default lr 1e-5 (bench/weight_patches.py: 30.6-67.1x, mean 54.1x) |
| version sent, adapters | 65.6 GB / 131.8 = 0.50 GB | full / rank-4 adapter measured on SmolLM2 in bfloat16 (`lora_ratio` 131.8x); a 32B model's adapter of the same rank is a smaller share of it, so this overstates its bytes |
| a file | 2 groups of 16 samples, 4,000 tokens each: 128,000 tokens | assumed (long reasoning) |
| a worker's speed | 1,000 tokens/s (x 0.5, 1, 2 in turn) | assumed: one GPU node generating with vLLM |
| a version's load on a worker | 60 s | assumed |
| the trainer's update | 240 s per step of 256 groups | assumed |
| a validator's check | 1/8 of the file's generation (prefill only) | assumed; sample rate 0.25 |
| the orchestrator | 2 ms per request | bench/orchestrator_load.py's order of magnitude |
| relays | 1 Gbit/s each, the origin 1 Gbit/s | assumed |
| batch | 256 groups, 3 batches of work out at most, async_level 2 (the default) or 3 | |

Relays are sized by the model: the tree grows (8, 16, 32, ... relays on its last
level, the same fan-out at every level) until the workers' weights lag p50 is within
a quarter of an update (`LAG_GOAL`), or to the size with the least lag where none is. Validators: enough to
keep the checks under 80% of their time. Each run is `STEPS` steps; `trainer_busy`
is over all of them (the first steps wait for version 0 and the pipeline to fill),
`steady_busy` the update over the median step (the pipeline full).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from swarmrl.plan.model import Costs, Outcome, Swarm, Workers, simulate

PARAMS_32B = 32.8e9
VERSIONS = {"patches": 54.1, "adapters": 131.8}  # full / what a version sends, measured
TOKENS_PER_FILE = 2 * 16 * 4000
WORKER_TOKENS_PER_S = 1000.0
LEVELS = 3
LINKS = (100.0, 300.0, 1000.0)  # Mbit/s, the workers' in turn
ASYNC_LEVELS = (2, 3)
WORKERS = (100, 1000)
STEPS = 10
LAG_GOAL = 0.25  # the workers' weights lag p50, in trainer updates


def costs(ratio: float = VERSIONS["patches"]) -> Costs:
    file_s = TOKENS_PER_FILE / WORKER_TOKENS_PER_S
    return Costs(
        file_s=file_s, train_s=240.0, validate_s=file_s / 8, load_s=60.0,
        version_mb=PARAMS_32B * 2 / ratio / 1e6, file_mb=2.0, signal=0.7,
        start_s=300.0, request_ms=2.0, measured_on="assumed: see plan/project.py",
    )  # fmt: skip


def swarm(workers: int, links: tuple[float, ...], relays: list[int], async_level: int = 2) -> Swarm:
    kinds: dict[tuple[float, float], int] = {}
    for i in range(workers):
        kind = (links[i % len(links)], (0.5, 1.0, 2.0)[i % 3])
        kinds[kind] = kinds.get(kind, 0) + 1
    return Swarm(
        workers=[Workers(n, mbit, speed=s) for (mbit, s), n in kinds.items()],
        steps=STEPS, batch_groups=256, groups_per_file=2, async_level=async_level,
        max_pending_groups=3 * 256, relays=relays, relay_mbit=1000.0,
        origin_mbit=1000.0, validators=64, validator_mbit=1000.0,
        sample_rate=0.25, heartbeat_s=10.0,
    )  # fmt: skip


def tree(last: int, levels: int) -> list[int]:
    """Relays per level for `last` relays on the last level: the same fan-out at
    every level (last ** (1 / levels))."""
    return [max(1, round(last ** (k / levels))) for k in range(1, levels + 1)]


def sized(workers: int, ratio: float, async_level: int) -> tuple[list[int], Outcome]:
    """The smallest tree (8, 16, 32, ... 1,024 relays on its last level) that brings
    the workers' weights lag p50 within `LAG_GOAL` updates, or, if none does, the one
    with the least lag (more relays also load the level above them more); and the
    model's outcome with it."""
    best: tuple[list[int], Outcome] | None = None
    c = costs(ratio)
    last = 8
    while last <= 1024:
        relays = tree(last, LEVELS)
        out = simulate(swarm(workers, LINKS, relays, async_level), c)
        lag = out.weights_lag_s["nodes"]["p50"]
        if best is None or lag < best[1].weights_lag_s["nodes"]["p50"]:
            best = (relays, out)
        if lag <= LAG_GOAL * c.train_s:
            break
        last *= 2
    assert best is not None
    return best


def validators_needed(out: Outcome) -> int:
    """Validators that keep the checks under 80% of their time: checked files per
    second times a check's seconds, over 0.8."""
    c = costs()
    rate = out.files["generated"] / out.wall_s * 0.25  # the sample rate of `swarm`
    return max(1, math.ceil(rate * c.validate_s * 2 / c.groups / 0.8))


def rows() -> list[dict]:
    got = []
    for versions, ratio in VERSIONS.items():
        for workers in WORKERS:
            for async_level in ASYNC_LEVELS:
                relays, o = sized(workers, ratio, async_level)
                train_s = costs(ratio).train_s
                got.append({
                    "versions": versions, "gb_per_version": round(costs(ratio).version_mb / 1e3, 2),
                    "workers": workers, "async_level": async_level,
                    "relays": "+".join(str(n) for n in relays),
                    "validators": validators_needed(o),
                    "lag_p50_s": o.weights_lag_s["nodes"]["p50"],
                    "lag_p99_s": o.weights_lag_s["nodes"]["p99"],
                    "step_s": o.step_s_p50, "trainer_busy": o.trainer_busy_fraction,
                    "steady_busy": round(min(1.0, train_s / o.step_s_p50), 3) if o.step_s_p50 else None,
                    "stale_fraction": o.stale_fraction,
                    "orchestrator_req_s": o.orchestrator_requests_per_s,
                })  # fmt: skip
    return got


def write(where: Path) -> list[dict]:
    where.mkdir(parents=True, exist_ok=True)
    got = rows()
    head = list(got[0])
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    lines += ["| " + " | ".join(str(r[k]) for k in head) + " |" for r in got]
    (where / "projection.md").write_text("\n".join(lines) + "\n")
    (where / "projection.json").write_text(json.dumps(got, indent=1) + "\n")
    _figure(got, where / "projection.png")
    return got


def _figure(got: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(1, 2, figsize=(10, 4))
    for versions in VERSIONS:
        for async_level in ASYNC_LEVELS:
            sel = [r for r in got if r["versions"] == versions and r["async_level"] == async_level]
            label = f"{versions}, async_level {async_level}"
            xs = [r["workers"] for r in sel]
            ax[0].plot(xs, [r["steady_busy"] for r in sel], marker="o", label=label)
            ax[1].plot(xs, [r["lag_p50_s"] for r in sel], marker="o", label=label)
    ax[0].set(xscale="log", xlabel="workers", ylabel="trainer busy, pipeline full", ylim=(0, 1.05))
    ax[1].set(xscale="log", xlabel="workers", ylabel="workers' weights lag p50 (s)")
    ax[0].legend(fontsize=7)
    fig.suptitle("INTELLECT-2-like runs (32B), projected by swarmrl plan")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
