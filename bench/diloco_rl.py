"""DiLoCo for RL: 2 trainer sites against 1 site with the same total samples.

usage: python bench/diloco_rl.py [--steps S] [--inner-steps H] [--seed N] [--out DIR]
       [-- extra overrides for every run]

Runs the tiny model's default swarm (configs/tiny.toml) twice:
- "diloco": `trainer.diloco.sites = 2`, S steps per site, a sync every H steps;
- "single": one site, 2·S steps (the same samples trained on: 2·S batches).
Prints JSON: per run the reward of the rollouts read (the first and last
tenth of the samples), the end-of-run held-out greedy reward of the final
model(s) (level 0, 256 problems, as `swarmrl rl` reports it), the highest
curriculum level, the wall time; and reward.png in DIR plots reward against
samples trained for both. A learning result, not a speed benchmark: the sites
share this machine's cores, so wall times compare only the overheads.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run(name: str, out: Path, overrides: list[str]) -> tuple[float, str]:
    cmd = [sys.executable, "-m", "swarmrl", "rl", "--config", str(ROOT / "configs/tiny.toml"),
           f"runs_dir={json.dumps(str(out))}", f"name={name}", *overrides, "--fresh"]  # fmt: skip
    t0 = time.time()
    res = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    if res.returncode != 0:
        sys.exit(f"{name} failed:\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}")
    return time.time() - t0, res.stdout


def rows(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def curve(series: list[list[dict]]) -> list[tuple[int, float]]:
    """(samples trained so far, reward read) for every step of every site, in sample order:
    the sites' steps interleaved as they ran, by elapsed time."""
    steps = sorted((r["elapsed_s"], r["samples"], r["reward"]) for s in series for r in s)
    total, out = 0, []
    for _, n, reward in steps:
        total += n
        out.append((total, reward))
    return out


def summary(series: list[list[dict]], logs: list[str], wall: float) -> dict:
    c = curve(series)
    tenth = max(1, len(c) // 10)
    evals = []
    for text in logs:
        m = re.search(r"held-out greedy reward at level 0 \(\d+ problems\): start ([\d.]+) "
                      r"-> final ([\d.]+)", text)  # fmt: skip
        if m:
            evals.append((float(m.group(1)), float(m.group(2))))
    return {
        "samples": c[-1][0],
        "reward_first_tenth": sum(r for _, r in c[:tenth]) / tenth,
        "reward_last_tenth": sum(r for _, r in c[-tenth:]) / tenth,
        "heldout_start": evals[0][0] if evals else None,
        "heldout_final": [f for _, f in evals],
        "max_level": max(r["level"] for s in series for r in s),
        "wall_s": round(wall, 1),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=60, help="steps per DiLoCo site")
    ap.add_argument("--inner-steps", type=int, default=10)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=str(ROOT / "runs" / "bench-diloco-rl"))
    ap.add_argument("extra", nargs="*", help="overrides for every run")
    args = ap.parse_args()
    out = Path(args.out)
    common = [f"seed={args.seed}", *args.extra]
    wall_d, _ = run("diloco", out, [*common, f"trainer.steps={args.steps}",
                                    "trainer.diloco.sites=2",
                                    f"trainer.diloco.inner_steps={args.inner_steps}"])  # fmt: skip
    sites = [rows(out / "diloco" / f"site-{k}" / "metrics.jsonl") for k in (0, 1)]
    site_logs = [(out / "diloco" / "logs" / f"site-{k}.log").read_text() for k in (0, 1)]
    wall_s, text = run("single", out, [*common, f"trainer.steps={2 * args.steps}"])
    single = [rows(out / "single" / "metrics.jsonl")]
    result = {
        "steps_per_site": args.steps,
        "inner_steps": args.inner_steps,
        "seed": args.seed,
        "diloco_2_sites": summary(sites, site_logs, wall_d),
        "single_site": summary(single, [text], wall_s),
        "outer_steps": sites[0][-1]["outer_step"],
    }
    plot(out / "reward.png", {"2 DiLoCo sites": sites, "1 site": single})
    print(json.dumps(result))


def plot(path: Path, runs: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for label, series in runs.items():
        c = curve(series)
        k = 8  # a moving average over 8 steps
        smooth = [sum(r for _, r in c[max(0, i - k + 1) : i + 1]) / len(c[max(0, i - k + 1) : i + 1])
                  for i in range(len(c))]  # fmt: skip
        ax.plot([n for n, _ in c], smooth, label=label)
    ax.set_xlabel("samples trained on (all sites)")
    ax.set_ylabel("reward of the rollouts read (8-step mean)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


if __name__ == "__main__":
    main()
