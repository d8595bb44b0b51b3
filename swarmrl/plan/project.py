"""INTELLECT-2-like runs, projected with the planner (plan/model.py): a 32B policy,
100 to 1,000 workers of mixed speed on 100 Mbit/s to 1 Gbit/s links, relay trees
of 1 to 3 levels. `swarmrl plan --project DIR` writes DIR/projection.md (a table)
and DIR/projection.png (a figure) and returns the rows.

What is measured and what is assumed (none of it ran on a GPU here):

| input | value | source |
| --- | --- | --- |
| version sent | 65.5 GB / 14.0 = 4.68 GB | 32.8e9 parameters in bfloat16; patch ratio measured on SmolLM2 at lr 2e-5 (docs/results.md, weight patches) |
| a file | 2 groups of 16 samples, 4,000 tokens each: 128,000 tokens | assumed (long reasoning) |
| a worker's speed | 1,000 tokens/s (x 0.5, 1, 2 in turn) | assumed: one GPU node generating with vLLM |
| the trainer's update | 240 s per step of 256 groups | assumed |
| a validator's check | 1/8 of the file's generation (prefill only) | assumed; sample rate 0.25 |
| the orchestrator | 2 ms per request | bench/orchestrator_load.py's order of magnitude |
| relays | 1 Gbit/s each, the origin 1 Gbit/s | assumed |

The validators are sized by the model: the fewest (of 1, 2, 4, ... 64) for which
the busiest stays under 80% of its time.
"""

from __future__ import annotations

import json
from pathlib import Path

from swarmrl.plan.model import Costs, Outcome, Swarm, Workers, simulate

PARAMS_32B = 32.8e9
PATCH_RATIO = 14.0  # docs/results.md: full / patch at lr 2e-5
TOKENS_PER_FILE = 2 * 16 * 4000
WORKER_TOKENS_PER_S = 1000.0
TREES = {1: [8], 2: [4, 16], 3: [2, 8, 32]}
LINK_MIXES = {"100 Mbit/s - 1 Gbit/s": (100.0, 300.0, 1000.0), "1 Gbit/s": (1000.0,)}


def costs() -> Costs:
    file_s = TOKENS_PER_FILE / WORKER_TOKENS_PER_S
    return Costs(
        file_s=file_s, train_s=240.0, validate_s=file_s / 8, load_s=60.0,
        version_mb=PARAMS_32B * 2 / PATCH_RATIO / 1e6, file_mb=2.0, signal=0.7,
        start_s=300.0, request_ms=2.0, measured_on="assumed: see plan/project.py",
    )  # fmt: skip


def swarm(workers: int, links: tuple[float, ...], levels: int, validators: int) -> Swarm:
    kinds: dict[tuple[float, float], int] = {}
    for i in range(workers):
        kind = (links[i % len(links)], (0.5, 1.0, 2.0)[i % 3])
        kinds[kind] = kinds.get(kind, 0) + 1
    return Swarm(
        workers=[Workers(n, mbit, speed=s) for (mbit, s), n in kinds.items()],
        steps=6, batch_groups=256, groups_per_file=2, async_level=2,
        max_pending_groups=256, relays=TREES[levels], relay_mbit=1000.0,
        origin_mbit=1000.0, validators=validators, validator_mbit=1000.0,
        sample_rate=0.25, heartbeat_s=10.0,
    )  # fmt: skip


def sized(workers: int, links: tuple[float, ...], levels: int) -> tuple[int, Outcome]:
    validators = 1
    while True:
        out = simulate(swarm(workers, links, levels, validators), costs())
        if out.validator_use < 0.8 or validators >= 64:
            return validators, out
        validators *= 2


def rows() -> list[dict]:
    got = []
    for workers in (100, 300, 1000):
        for mix, links in LINK_MIXES.items():
            for levels in TREES:
                validators, o = sized(workers, links, levels)
                got.append({
                    "workers": workers, "links": mix, "levels": levels,
                    "relays": sum(TREES[levels]), "validators": validators,
                    "lag_p50_s": o.weights_lag_s["nodes"]["p50"],
                    "lag_p99_s": o.weights_lag_s["nodes"]["p99"],
                    "origin_gb_per_version": round(o.origin_mb / 1e3 / o.steps, 1),
                    "step_s": o.step_s_p50, "trainer_busy": o.trainer_busy_fraction,
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
    for mix in LINK_MIXES:
        for levels in TREES:
            sel = [r for r in got if r["links"] == mix and r["levels"] == levels]
            label = f"{mix}, {levels} level{'s' if levels > 1 else ''}"
            xs = [r["workers"] for r in sel]
            ax[0].plot(xs, [r["lag_p50_s"] for r in sel], marker="o", label=label)
            ax[1].plot(xs, [r["trainer_busy"] for r in sel], marker="o", label=label)
    ax[0].set(xscale="log", xlabel="workers", ylabel="weights lag p50 (s)")
    ax[1].set(xscale="log", xlabel="workers", ylabel="trainer busy fraction", ylim=(0, 1))
    ax[0].legend(fontsize=7)
    fig.suptitle("INTELLECT-2-like runs (32B, patches), projected by swarmrl plan")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
