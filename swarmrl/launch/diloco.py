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
import sys
import time
from pathlib import Path

from swarmrl.config.diloco import DilocoConfig
from swarmrl.config.pretrain import PretrainConfig
from swarmrl.launch.swarm import Proc, _free_port, _tail


def lighthouse_proc(d: DilocoConfig, run: Path) -> tuple[Proc, str]:
    """A lighthouse process on a free loopback port, and its URL."""
    port = _free_port("127.0.0.1")
    argv = [sys.executable, "-m", "swarmrl.diloco.lighthouse", "--bind", f"127.0.0.1:{port}",
            "--min-sites", str(d.min_sites), "--join-timeout-s", str(d.join_timeout_s),
            "--heartbeat-timeout-s", str(d.heartbeat_timeout_s)]  # fmt: skip
    return Proc("lighthouse", argv, run / "logs" / "lighthouse.log", 1), f"http://127.0.0.1:{port}"


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
    procs = [
        Proc(
            f"site-{k}",
            site_argv(config_path, overrides, k, lighthouse, resume),
            run / "logs" / f"site-{k}.log",
            cfg.threads,
        )  # fmt: skip
        for k in range(cfg.sites)
    ]
    for p in procs:
        p.start()
    t0, shown, tty, done_at = time.time(), "", sys.stdout.isatty(), None
    try:
        while True:
            if server is not None and server.poll() is not None:
                print(f"the lighthouse exited ({server.poll()}); restarting it on the same port",
                      flush=True)  # fmt: skip
                server.restarts += 1
                server.start()
            codes = [p.poll() for p in procs]
            for p, code in zip(procs, codes, strict=True):
                if code not in (None, 0):
                    print(f"{p.name} exited with code {code}:\n{_tail(p.log_path)}", flush=True)
                    if not cfg.restart:
                        return 1
                    p.restarts += 1
                    print(f"{p.name}: restarting (from its newest checkpoint; a live peer "
                          "further on heals it)", flush=True)  # fmt: skip
                    if "--resume" not in p.argv:
                        p.argv.insert(p.argv.index("--site"), "--resume")
                    p.start()
            if all(code == 0 for code in codes):
                break
            if any(code == 0 for code in codes):  # the run is over; a late joiner has no quorum
                done_at = done_at or time.time()
                if time.time() - done_at > 60:
                    print("the run is over; stopping sites that did not finish", flush=True)
                    break
            else:
                done_at = None
            line = progress_line(cfg, read_rows(run), sum(c is None for c in codes), t0)
            if line != shown:
                print(("\r" + line + "\033[K") if tty else line, end="" if tty else "\n",
                      flush=True)  # fmt: skip
                shown = line
            time.sleep(0.5)
    finally:
        for p in procs:
            p.signal(15)
        if server is not None:
            server.signal(15)
    rows = read_rows(run)
    print(("\n" if tty else "") + progress_line(cfg, rows, 0, t0))
    plot = write_plot(run, rows)
    first = min(rows, key=lambda r: r["outer_step"])["eval_loss"]
    last = max(rows, key=lambda r: r["outer_step"])["eval_loss"]
    print(f"held-out loss {first:.4f} -> {last:.4f}; plot {plot}; logs {run / 'logs'}")
    return 0
