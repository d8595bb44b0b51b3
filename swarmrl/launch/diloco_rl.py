"""`swarmrl rl` with `trainer.diloco.sites = N`: N swarms whose trainers sync by DiLoCo.

The embedded default of what runs on separate machines in practice (there,
each site runs its own `swarmrl rl` with `trainer.diloco.site = K` and
`trainer.diloco.lighthouse` naming one lighthouse). Here the launcher starts a
torchft lighthouse on loopback and one `swarmrl rl` per site, in
runs/<name>/site-K/ (its own orchestrator, trainer, relays, validators and
workers; seed + K, so each site draws its own problems), with that launcher's
output in runs/<name>/logs/site-K.log. It shows one progress line for all
sites, restarts a site that fails (with --resume: its trainer is healed from a
live peer that is further on), and writes reward.png (each site's reward per
step) at the end. The trainers' side is trainer/diloco.py.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from swarmrl.config import RunConfig
from swarmrl.launch.diloco import lighthouse_proc
from swarmrl.launch.swarm import LaunchError, Proc, _stop_all, _tail, prepare_run_dir

MAX_RESTARTS = 2


def _rows(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def site_argv(config_path, overrides, run: Path, cfg: RunConfig, k: int, lighthouse: str,
              resume: bool) -> list[str]:  # fmt: skip
    return [
        sys.executable, "-m", "swarmrl", "rl",
        *(["--config", config_path] if config_path else []), *overrides,
        f"runs_dir={json.dumps(str(run))}", f"name=site-{k}", f"seed={cfg.seed + k}",
        f"trainer.diloco.site={k}", f"trainer.diloco.lighthouse={json.dumps(lighthouse)}",
        *(["--resume"] if resume else []),
    ]  # fmt: skip


def progress_line(cfg: RunConfig, sites: list[list[dict]]) -> str:
    parts = []
    for k, rows in enumerate(sites):
        if not rows:
            parts.append(f"site {k}: starting")
            continue
        r = rows[-1]
        parts.append(f"site {k}: step {r['step']}/{cfg.trainer.steps} reward {r['reward']:.3f} "
                     f"outer {r.get('outer_step', 0)}")  # fmt: skip
    return " | ".join(parts)


def write_plot(run: Path, sites: list[list[dict]]) -> Path | None:
    if not any(sites):
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for k, rows in enumerate(sites):
        ax.plot([r["step"] for r in rows], [r["reward"] for r in rows], ".-", alpha=0.7,
                label=f"site {k}")  # fmt: skip
        synced = [r for r in rows if r.get("synced")]
        ax.plot([r["step"] for r in synced], [r["reward"] for r in synced], "k|", ms=12)
    ax.set_xlabel("step of the site (| : DiLoCo sync)")
    ax.set_ylabel("reward of the rollouts read")
    ax.legend()
    out = run / "reward.png"
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


def launch_sites(cfg: RunConfig, config_path: str | None, overrides: list[str], resume: bool,
                 fresh: bool) -> int:  # fmt: skip
    d = cfg.trainer.diloco
    if cfg.trainer.ranks > 1:
        raise LaunchError("trainer.diloco needs trainer.ranks = 1 (one process per site)")
    run = prepare_run_dir(cfg, resume, fresh)
    server, lighthouse = lighthouse_proc(d, run)
    procs = [
        Proc(
            f"site-{k}",
            site_argv(config_path, overrides, run, cfg, k, lighthouse, resume),
            run / "logs" / f"site-{k}.log",
            1,
        )  # fmt: skip
        for k in range(d.sites)
    ]
    print(f"swarmrl: {d.sites} DiLoCo sites in {run}, lighthouse {lighthouse}, a sync every "
          f"{d.inner_steps} steps; logs in {run / 'logs'} and {run}/site-K/logs", flush=True)  # fmt: skip
    server.start()
    for p in procs:
        p.start()
    t0, shown, tty, failed = time.time(), "", sys.stdout.isatty(), False
    metrics = [run / f"site-{k}" / "metrics.jsonl" for k in range(d.sites)]
    try:
        while True:
            if server.poll() is not None:
                print("\nthe lighthouse exited; restarting it on its port", flush=True)
                server.start()
            codes = [p.poll() for p in procs]
            for p, code in zip(procs, codes, strict=True):
                if code in (None, 0):
                    continue
                print(f"\n{p.name} exited with code {code}:\n{_tail(p.log_path)}", flush=True)
                if p.restarts >= MAX_RESTARTS:
                    failed = True
                    continue
                p.restarts += 1
                print(f"{p.name}: restarting with --resume (a live peer heals it)", flush=True)
                if "--resume" not in p.argv:
                    p.argv.append("--resume")
                p.start()
            codes = [p.poll() for p in procs]
            if all(c is not None for c in codes) and (failed or all(c == 0 for c in codes)):
                break
            line = progress_line(cfg, [_rows(m) for m in metrics])
            if line != shown:  # elapsed time only on a line that shows something new
                out = f"{line} | {time.time() - t0:.0f}s"
                print(("\r" + out + "\033[K") if tty else out, end="" if tty else "\n",
                      flush=True)  # fmt: skip
                shown = line
            time.sleep(1.0)
    except KeyboardInterrupt:
        print("\ninterrupted; stopping the sites", flush=True)
        failed = True
    finally:
        _stop_all(procs, graceful=False, grace_s=60.0)  # each site's launcher stops its own
        server.signal(15)
    sites = [_rows(m) for m in metrics]
    print(("\n" if tty else "") + f"{progress_line(cfg, sites)} | {time.time() - t0:.0f}s")
    for k, rows in enumerate(sites):
        if rows:
            first = sum(r["reward"] for r in rows[:5]) / len(rows[:5])
            last = sum(r["reward"] for r in rows[-5:]) / len(rows[-5:])
            print(f"swarmrl: site {k}: {len(rows)} steps, {rows[-1].get('outer_step', 0)} outer "
                  f"steps, reward first 5 steps {first:.3f} -> last 5 {last:.3f}")  # fmt: skip
    print(f"swarmrl: plot {write_plot(run, sites)}; final models in {run}/site-K/final")
    return 1 if failed else 0
