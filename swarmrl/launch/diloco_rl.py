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
import signal
import sys
import time
from pathlib import Path

from swarmrl.config import RunConfig
from swarmrl.launch.diloco import lighthouse_proc
from swarmrl.launch.supervisor import Action, Proc, Supervisor, stop_all, tail
from swarmrl.launch.swarm import LaunchError, prepare_run_dir

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


def site_proc(cfg: RunConfig, config_path: str | None, overrides: list[str], run: Path, k: int,
              lighthouse: str, resume: bool) -> Proc:  # fmt: skip
    """Site `k`'s own `swarmrl rl`; restarted up to MAX_RESTARTS times, with --resume."""
    argv = site_argv(config_path, overrides, run, cfg, k, lighthouse, resume)
    again = None if "--resume" in argv else argv + ["--resume"]
    return Proc(f"site-{k}", argv, run / "logs" / f"site-{k}.log", 1,
                max_restarts=MAX_RESTARTS, restart_argv=again)  # fmt: skip


class SitesWatch:
    """What `swarmrl rl` shows and decides while its DiLoCo sites run (a supervisor.Watcher)."""

    def __init__(self, cfg: RunConfig, run: Path, lighthouse: Proc, sites: list[Proc]):
        self.cfg, self.lighthouse, self.sites = cfg, lighthouse, sites
        self.metrics = [run / f"site-{k}" / "metrics.jsonl" for k in range(len(sites))]
        self.t0, self.shown, self.tty, self.failed = time.time(), "", sys.stdout.isatty(), False

    def exited(self, proc: Proc, code: int, action: Action) -> int | None:
        if proc is self.lighthouse:
            print("\nthe lighthouse exited; restarting it on its port", flush=True)
            return None
        print(f"\n{proc.name} exited with code {code}:\n{tail(proc.log_path)}", flush=True)
        if action == "give_up":  # the others go on; the run fails when they are done
            self.failed = True
            return None
        print(f"{proc.name}: restarting with --resume (a live peer heals it)", flush=True)
        return None

    def round(self, seen: dict[str, int | None]) -> int | None:
        codes = [p.poll() for p in self.sites]
        if all(c is not None for c in codes) and (self.failed or all(c == 0 for c in codes)):
            return 1 if self.failed else 0
        line = progress_line(self.cfg, [_rows(m) for m in self.metrics])
        if line != self.shown:  # elapsed time only on a line that shows something new
            out = f"{line} | {time.time() - self.t0:.0f}s"
            print(("\r" + out + "\033[K") if self.tty else out, end="" if self.tty else "\n",
                  flush=True)  # fmt: skip
            self.shown = line
        return None

    def interrupted(self, signum: int) -> int:
        print("\ninterrupted; stopping the sites", flush=True)
        self.failed = True
        return 1


def launch_sites(cfg: RunConfig, config_path: str | None, overrides: list[str], resume: bool,
                 fresh: bool) -> int:  # fmt: skip
    d = cfg.trainer.diloco
    if cfg.trainer.ranks > 1:
        raise LaunchError("trainer.diloco needs trainer.ranks = 1 (one process per site)")
    run = prepare_run_dir(cfg, resume, fresh)
    server, lighthouse = lighthouse_proc(d, run)
    sites = [
        site_proc(cfg, config_path, overrides, run, k, lighthouse, resume) for k in range(d.sites)
    ]
    print(f"swarmrl: {d.sites} DiLoCo sites in {run}, lighthouse {lighthouse}, a sync every "
          f"{d.inner_steps} steps; logs in {run / 'logs'} and {run}/site-K/logs", flush=True)  # fmt: skip
    server.start()
    for p in sites:
        p.start()
    watch = SitesWatch(cfg, run, server, sites)
    with Supervisor([server, *sites], stop_signals=(signal.SIGINT,)) as supervisor:
        try:
            supervisor.watch(1.0, watch)
        finally:
            stop_all(sites, graceful=False, grace_s=60.0)  # each site's launcher stops its own
            server.signal(signal.SIGTERM)
    print_summary(cfg, run, watch)
    return 1 if watch.failed else 0


def print_summary(cfg: RunConfig, run: Path, watch: SitesWatch) -> None:
    sites = [_rows(m) for m in watch.metrics]
    print(
        ("\n" if watch.tty else "") + f"{progress_line(cfg, sites)} | {time.time() - watch.t0:.0f}s"
    )
    for k, rows in enumerate(sites):
        if rows:
            first = sum(r["reward"] for r in rows[:5]) / len(rows[:5])
            last = sum(r["reward"] for r in rows[-5:]) / len(rows[-5:])
            print(f"swarmrl: site {k}: {len(rows)} steps, {rows[-1].get('outer_step', 0)} outer "
                  f"steps, reward first 5 steps {first:.3f} -> last 5 {last:.3f}")  # fmt: skip
    print(f"swarmrl: plot {write_plot(run, sites)}; final models in {run}/site-K/final")
