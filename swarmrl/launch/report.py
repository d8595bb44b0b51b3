"""`report.png`: reward with the difficulty level (and the held-out accuracy before
and after, once eval.json holds it), signal fraction, entropy and mismatch, loss and
staleness against step, from metrics.jsonl."""

from __future__ import annotations

import json
from pathlib import Path


def read_metrics(path: Path) -> list[dict]:
    if not Path(path).exists():
        return []
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def write_report(metrics_path: Path, out: Path) -> Path | None:
    rows = read_metrics(metrics_path)
    if not rows:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [r["step"] for r in rows]
    fig, axes = plt.subplots(1, 5, figsize=(21, 3.6))
    axes[0].plot(steps, [r["reward"] for r in rows], label="reward")
    axes[0].plot(steps, [r["task_reward"] for r in rows], label="task reward", alpha=0.7)
    axes[0].set_title("reward and difficulty level")
    if "level" in rows[0]:
        lv = axes[0].twinx()
        lv.step(steps, [r["level"] for r in rows], where="post", color="tab:purple", alpha=0.8)
        lv.set_ylabel("difficulty level", color="tab:purple")
        lv.set_ylim(-0.5, max(r["level"] for r in rows) + 1.5)
        lv.yaxis.get_major_locator().set_params(integer=True)
        axes[0].plot([], [], color="tab:purple", label="level (right axis)")
    held = _held_out(Path(metrics_path).parent / "eval.json")
    if held:
        axes[0].scatter([steps[0], steps[-1]][: len(held)], held, color="black", zorder=3,
                        label="held-out accuracy (greedy)")  # fmt: skip
    axes[0].legend(loc="lower right", fontsize=8)
    if "signal_fraction" in rows[0]:
        axes[1].plot(steps, [r["signal_fraction"] for r in rows], color="tab:orange")
        axes[1].set_ylim(0, 1.05)
    axes[1].set_title("groups read with signal (fraction)")
    axes[2].plot(steps, [r["entropy"] for r in rows], color="tab:blue", label="entropy")
    if "mismatch_kl" in rows[-1]:
        axes[2].plot(steps, [r.get("mismatch_kl", float("nan")) for r in rows],
                     color="tab:brown", label="mismatch KL(π_behav‖π_prox)")  # fmt: skip
        axes[2].set_yscale("log")
    axes[2].legend(loc="lower left", fontsize=8)
    axes[2].set_title("entropy and mismatch (per token)")
    axes[3].plot(steps, [r["loss"] for r in rows], color="tab:red")
    axes[3].set_title("loss")
    axes[4].plot(steps, [r["staleness"] for r in rows], color="tab:green")
    axes[4].set_title("staleness (steps)")
    for ax in axes:
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    fig.suptitle(
        f"{Path(metrics_path).parent.name}: {len(rows)} steps, {rows[-1]['elapsed_s']:.0f}s"
    )
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


def _held_out(path: Path) -> list[float]:
    """The start and final held-out accuracy the launcher recorded (as far as it has)."""
    if not path.exists():
        return []
    res = json.loads(path.read_text())
    return [res[k]["accuracy"] for k in ("start_model", "final_model") if k in res]
