"""`swarmrl diloco`: a lighthouse and N DiLoCo sites as local processes.

The embedded default of what runs on separate machines in practice (each site
runs `swarmrl diloco-site --lighthouse URL`). The launcher starts a torchft
lighthouse on loopback unless `diloco.lighthouse` names one, starts the sites
with a log each (runs/<name>/logs/site-<k>.log), shows one progress line per
outer step, and restarts a site that dies (`restart`) from its newest checkpoint
(a live peer that is further on heals it), and the lighthouse on its port. At the end it writes
loss.png (held-out loss of the global weights per outer step).
"""

from __future__ import annotations

import json
import shutil
import signal
import sys
import time
from pathlib import Path

from swarmrl.config.diloco import DilocoConfig
from swarmrl.config.pretrain import PretrainConfig
from swarmrl.launch.supervisor import Action, Proc, Supervisor, free_port, tail


def lighthouse_proc(d: DilocoConfig, run: Path) -> tuple[Proc, str]:
    """A lighthouse process on a free loopback port, and its URL; restarted on any exit."""
    port = free_port("127.0.0.1")
    argv = [sys.executable, "-m", "swarmrl.diloco.lighthouse", "--bind", f"127.0.0.1:{port}",
            "--min-sites", str(d.min_sites), "--join-timeout-s", str(d.join_timeout_s),
            "--heartbeat-timeout-s", str(d.heartbeat_timeout_s)]  # fmt: skip
    proc = Proc(
        "lighthouse", argv, run / "logs" / "lighthouse.log", max_restarts=None, keep_up=True
    )
    return proc, f"http://127.0.0.1:{port}"


def read_rows(run: Path) -> list[dict]:
    rows = []
    for path in sorted(run.glob("metrics-site*.jsonl")):
        for line in path.read_text().splitlines():
            if line.strip():
                rows.append(json.loads(line))
    return rows


def progress_line(cfg: PretrainConfig, rows: list[dict], alive: int, t0: float) -> str:
    if not rows:
        return f"diloco: {alive} sites up, waiting for the first quorum ({time.time() - t0:.0f}s)"
    last = max(rows, key=lambda r: (r["outer_step"], r["time"]))
    sent = sum(r["bytes_sent"] for r in rows)
    return (
        f"outer step {last['outer_step']}/{cfg.outer_steps}  eval loss {last['eval_loss']:.4f}  "
        f"sites {last['contributors']}/{last['sites']} contributing, {alive} up  "
        f"sent {sent / 1e6:.1f} MB  {time.time() - t0:.0f}s"
    )


def write_plot(run: Path, rows: list[dict]) -> Path | None:
    if not rows:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for site in sorted({r["site"] for r in rows}):
        mine = [r for r in rows if r["site"] == site]
        ax.plot([r["outer_step"] for r in mine], [r["eval_loss"] for r in mine], ".-",
                label=f"site {site}", alpha=0.7)  # fmt: skip
    ax.set_xlabel("outer step")
    ax.set_ylabel("held-out loss of the global weights")
    ax.legend()
    out = run / "loss.png"
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


def site_argv(config_path: str | None, overrides: list[str], site: int, lighthouse: str,
              resume: bool):  # fmt: skip
    cfg_args = (["--config", config_path] if config_path else []) + list(overrides)
    return [sys.executable, "-m", "swarmrl", "diloco-site", "--site", str(site),
            "--lighthouse", lighthouse, *(["--resume"] if resume else []), *cfg_args]  # fmt: skip


def site_proc(cfg: PretrainConfig, config_path: str | None, overrides: list[str], site: int,
              lighthouse: str, run: Path, resume: bool) -> Proc:  # fmt: skip
    """Site `site`; with `restart`, restarted without limit, from its newest checkpoint."""
    argv = site_argv(config_path, overrides, site, lighthouse, resume)
    i = argv.index("--site")
    again = None if "--resume" in argv else argv[:i] + ["--resume"] + argv[i:]
    return Proc(f"site-{site}", argv, run / "logs" / f"site-{site}.log", cfg.threads,
                max_restarts=None if cfg.restart else 0, restart_argv=again)  # fmt: skip


class DilocoWatch:
    """What `swarmrl diloco` shows and decides while its sites run (a supervisor.Watcher)."""

    def __init__(self, cfg: PretrainConfig, run: Path, lighthouse: Proc | None, sites: list[Proc]):
        self.cfg, self.run, self.lighthouse, self.sites = cfg, run, lighthouse, sites
        self.t0, self.shown, self.tty, self.done_at = time.time(), "", sys.stdout.isatty(), None

    def exited(self, proc: Proc, code: int, action: Action) -> int | None:
        if proc is self.lighthouse:
            print(f"the lighthouse exited ({code}); restarting it on the same port", flush=True)
            return None
        print(f"{proc.name} exited with code {code}:\n{tail(proc.log_path)}", flush=True)
        if action == "give_up":
            return 1
        print(f"{proc.name}: restarting (from its newest checkpoint; a live peer "
              "further on heals it)", flush=True)  # fmt: skip
        return None

    def round(self, seen: dict[str, int | None]) -> int | None:
        codes = [seen[p.name] for p in self.sites]
        if all(code == 0 for code in codes):
            return 0
        if any(code == 0 for code in codes):  # the run is over; a late joiner has no quorum
            self.done_at = self.done_at or time.time()
            if time.time() - self.done_at > 60:
                print("the run is over; stopping sites that did not finish", flush=True)
                return 0
        else:
            self.done_at = None
        line = progress_line(self.cfg, read_rows(self.run), sum(c is None for c in codes), self.t0)
        if line != self.shown:
            print(("\r" + line + "\033[K") if self.tty else line, end="" if self.tty else "\n",
                  flush=True)  # fmt: skip
            self.shown = line
        return None

    def interrupted(self, signum: int) -> int:  # not called: run_diloco catches no signal
        raise KeyboardInterrupt


def run_diloco(cfg: PretrainConfig, config_path: str | None, overrides: list[str],
               fresh: bool, resume: bool = False) -> int:  # fmt: skip
    run = Path(cfg.runs_dir) / cfg.name
    if run.exists() and fresh:
        shutil.rmtree(run)
    if run.exists() and any(run.glob("metrics-site*.jsonl")) and not resume:
        print(f"swarmrl diloco: {run} holds a run; pass --resume to go on or --fresh to "
              "replace it", file=sys.stderr)  # fmt: skip
        return 2
    (run / "logs").mkdir(parents=True, exist_ok=True)
    lighthouse, server = cfg.diloco.lighthouse, None
    if not lighthouse:
        server, lighthouse = lighthouse_proc(cfg.diloco, run)
        server.start()
    sites = [
        site_proc(cfg, config_path, overrides, k, lighthouse, run, resume) for k in range(cfg.sites)
    ]
    for p in sites:
        p.start()
    watch = DilocoWatch(cfg, run, server, sites)
    # Ctrl-C raises KeyboardInterrupt as usual; the sites get SIGTERM on the way out.
    with Supervisor(([server] if server else []) + sites, stop_signals=()) as supervisor:
        try:
            code = supervisor.watch(0.5, watch)
        finally:
            for p in [*sites, *([server] if server else [])]:
                p.signal(signal.SIGTERM)
    if code:
        return code
    rows = read_rows(run)
    print(("\n" if watch.tty else "") + progress_line(cfg, rows, 0, watch.t0))
    plot = write_plot(run, rows)
    first = min(rows, key=lambda r: r["outer_step"])["eval_loss"]
    last = max(rows, key=lambda r: r["outer_step"])["eval_loss"]
    print(f"held-out loss {first:.4f} -> {last:.4f}; plot {plot}; logs {run / 'logs'}")
    return 0
