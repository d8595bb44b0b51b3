"""`swarmrl rl`: the whole swarm on one machine, one process per role.

The launcher starts the orchestrator first (and waits for its /health), then
the trainer (which is also the SHARDCAST origin), `shardcast.relays` relays,
the validators and N workers as separate processes. Every process talks to
the others only through the orchestrator's HTTP API and SHARDCAST; workers
are started exactly as a contributor elsewhere would start one
(`swarmrl worker --orchestrator URL --home DIR`), with no config file. Each
process runs in
its own session, each told to die with the launcher through PDEATHSIG), with
torch threads set per process so they share the cores, and one log file per
process under runs/<name>/logs/. It shows progress from metrics.jsonl.

Failure policy:
- the trainer exits non-zero, or a worker keeps dying: every process is
  stopped (SIGTERM, then SIGKILL after a grace period) and the launcher exits
  non-zero naming the failing process and showing the end of its log;
- a worker the orchestrator refuses (ejected for a rejected file, banned)
  exits with code 3 and is not restarted: the run goes on without it;
- a worker, relay, validator or the orchestrator that dies is restarted
  (the orchestrator on the same port, from its database), up to
  `launcher.max_worker_restarts` times: losing a worker must not stop the
  swarm (its unfinished file is simply never uploaded; a relay comes back on
  the same port and workers fail over to other servers meanwhile);
- workers run at a lower CPU priority (`launcher.worker_niceness`): the
  trainer is the bottleneck of a swarm that shares one machine's cores;
- Ctrl-C stops everything cleanly; `--resume` continues from the newest
  complete version.
"""

from __future__ import annotations

import ctypes
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from swarmrl.config import RunConfig
from swarmrl.errors import EXIT_REFUSED, UserError
from swarmrl.launch.progress import Progress, fetch_ledger, summary_lines

log = logging.getLogger("swarmrl.launch.swarm")
GRACE_S = 10.0


class LaunchError(UserError, RuntimeError):
    pass


def _die_with_parent(niceness: int = 0) -> None:  # runs in the child between fork and exec
    if niceness:
        os.nice(niceness)
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:  # not Linux: no parent-death signal; stop() still kills the group
        pass


@dataclass
class Proc:
    name: str
    argv: list[str]
    log_path: Path
    threads: int
    niceness: int = 0
    exits_when_done: bool = True  # relays serve until told to stop
    popen: subprocess.Popen | None = None
    restarts: int = 0
    refused: bool = False  # a worker the orchestrator turned away (exit code 3)
    logf: object = field(default=None, repr=False)

    def start(self) -> None:
        env = dict(os.environ)
        for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
            env[var] = str(self.threads)
        env["PYTHONUNBUFFERED"] = "1"
        self.logf = open(self.log_path, "ab")
        self.popen = subprocess.Popen(
            self.argv,
            stdout=self.logf,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,
            preexec_fn=_die_with_parent,
        )

    def poll(self) -> int | None:
        return self.popen.poll() if self.popen else None

    def signal(self, sig: int) -> None:
        if self.popen and self.popen.poll() is None:
            try:
                os.killpg(self.popen.pid, sig)
            except ProcessLookupError:
                pass


def _tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except FileNotFoundError:
        return "(no log)"


def _free_port(host: str) -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def _shardcast_setup(cfg: RunConfig, base: list[str], cfg_args: list[str]):
    """Key, ports and relay processes; returns (overrides for every process, relays)."""
    from swarmrl.protocol.identity import load_or_create_key, public_key_hex

    sc = cfg.shardcast
    paths = cfg.paths
    key = load_or_create_key(Path(sc.key_file) if sc.key_file else paths.keys / "trainer.key")
    origin_port = sc.origin_port or _free_port(sc.host)
    origin_url = f"http://{sc.host}:{origin_port}"
    extra = [f"shardcast.origin_port={origin_port}", f"shardcast.public_key={public_key_hex(key)}"]
    relays, relay_urls = [], []
    for i in range(sc.relays):
        port = _free_port(sc.host)
        relay_urls.append(f"http://{sc.host}:{port}")
        argv = base + ["relay", "--upstream", origin_url, "--port", str(port)]
        argv += ["--dir", str(paths.relays / f"relay-{i}"), *cfg_args, *extra]
        log_path = paths.logs / f"relay-{i}.log"
        relays.append(Proc(f"relay-{i}", argv, log_path, threads=1, exits_when_done=False))
    if not sc.servers:
        extra.append("shardcast.servers=" + json.dumps(relay_urls or [origin_url]))
    return extra, relays


def prepare_run_dir(cfg: RunConfig, resume: bool, fresh: bool) -> Path:
    run = cfg.run_dir
    if run.exists() and any(run.iterdir()):
        if fresh:
            shutil.rmtree(run)
        elif not resume:
            raise LaunchError(
                f"run directory {run} already exists: pass --resume to continue it, "
                f"--fresh to delete it, or choose another name with name=..."
            )
    (run / "logs").mkdir(parents=True, exist_ok=True)
    return run


def _orchestrator_setup(cfg: RunConfig, base: list[str], cfg_args: list[str]):
    """The orchestrator process, its URL, and the overrides that point every process at it."""
    from swarmrl.orchestrator.server import operator_token
    from swarmrl.protocol.identity import public_key_hex
    from swarmrl.trainer.loop import trainer_key

    o = cfg.orchestrator
    port = o.port if o.url else _free_port(o.host)
    url = o.url or f"http://{o.host}:{port}"
    operator_token(cfg)  # created before anyone needs it (mode 0600)
    extra = [f"orchestrator.url={json.dumps(url)}"]
    own = [f"orchestrator.port={port}"]
    if not o.trainer_keys:
        own.append("orchestrator.trainer_keys=" + json.dumps([public_key_hex(trainer_key(cfg))]))
    argv = base + ["orchestrator", *cfg_args, *own, *extra]
    log_path = cfg.paths.logs / "orchestrator.log"
    return Proc("orchestrator", argv, log_path, threads=1, exits_when_done=False), url, extra


def _wait_healthy(url: str, proc: Proc, timeout_s: float = 60.0) -> None:
    import httpx

    deadline = time.time() + timeout_s
    while time.time() < deadline:
        if proc.poll() is not None:
            raise LaunchError(
                f"the orchestrator exited with code {proc.poll()}; last lines of "
                f"{proc.log_path}:\n{_tail(proc.log_path)}"
            )
        try:
            if httpx.get(url + "/health", timeout=2.0).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    raise LaunchError(f"the orchestrator at {url} did not answer /health in {timeout_s:.0f}s")


def _run_done(url: str) -> bool:
    import httpx

    try:
        return bool(httpx.get(url + "/health", timeout=5.0).json().get("done"))
    except (httpx.TransportError, ValueError):
        return False


def _validator_setup(cfg: RunConfig) -> list[str]:
    """Create the validators' keys up front, so the trainer is told whom to trust."""
    from swarmrl.protocol.identity import load_or_create_key, public_key_hex

    if not cfg.validator.enabled:
        return []
    keys = cfg.paths.keys
    pubs = [
        public_key_hex(load_or_create_key(keys / f"validator-{i}.key"))
        for i in range(cfg.validator.count)
    ]
    return ["validator.public_keys=" + json.dumps(pubs)]


def _cheat_list(cheaters: int, cheats: list[str] | None) -> list[str]:
    from swarmrl.sim.cheats import CHEATS, RL_CHEATS

    kinds = cheats or RL_CHEATS
    unknown = [c for c in kinds if c not in CHEATS]
    if unknown:
        raise LaunchError(f"unknown cheat(s) {unknown}; known: {', '.join(CHEATS)}")
    if cheaters and not kinds:
        raise LaunchError("--cheats is empty")
    return [kinds[i % len(kinds)] for i in range(cheaters)]


def launch(
    cfg: RunConfig,
    config_path: str | None,
    overrides: list[str],
    resume: bool,
    fresh: bool,
    cheaters: int = 0,
    cheats: list[str] | None = None,
) -> int:
    from swarmrl.models.loading import resolve_model_path

    resolve_model_path(cfg.model.path)  # fail before starting anything
    cheat_kinds = _cheat_list(cheaters, cheats)
    if cheat_kinds and not cfg.validator.enabled:
        raise LaunchError("--cheaters needs validator.enabled: nothing would stop them")
    run = prepare_run_dir(cfg, resume, fresh)
    base = [sys.executable, "-m", "swarmrl"]
    cfg_args = (["--config", config_path] if config_path else []) + list(overrides)
    relays: list[Proc] = []
    if cfg.shardcast.enabled:
        extra, relays = _shardcast_setup(cfg, base, cfg_args)
        cfg_args = cfg_args + extra
    cfg_args = cfg_args + _validator_setup(cfg)
    orchestrator, url, extra = _orchestrator_setup(cfg, base, cfg_args)
    cfg_args = cfg_args + extra
    for r in relays:
        r.argv += extra

    def proc(name: str, args: list[str], threads: int, niceness: int = 0) -> Proc:
        return Proc(name, base + args + cfg_args, run / "logs" / f"{name}.log", threads, niceness)

    def node(name: str, cheat: str | None = None) -> Proc:
        argv = base + ["worker", "--orchestrator", url, "--home", str(run / "nodes" / name)]
        argv += ["--threads", str(cfg.worker.threads)] + (["--cheat", cheat] if cheat else [])
        log_path = run / "logs" / f"{name}.log"
        return Proc(name, argv, log_path, cfg.worker.threads, cfg.launcher.worker_niceness)

    trainer = proc("trainer", ["trainer"] + (["--resume"] if resume else []), cfg.trainer.threads)
    if cfg.trainer.ranks > 1:  # the same command, one process per rank under torchrun
        trainer.argv[1:3] = [
            "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
            str(cfg.trainer.ranks), "-m", "swarmrl",
        ]  # fmt: skip
    workers = [node(f"worker-{i}") for i in range(cfg.launcher.workers)]
    cheater_procs = [node(f"cheater-{i}", k) for i, k in enumerate(cheat_kinds)]
    validators = [
        proc(f"validator-{i}", ["validator", "--index", str(i)], cfg.validator.threads)
        for i in range(cfg.validator.count if cfg.validator.enabled else 0)
    ]
    helpers = [orchestrator, *relays, *validators, *workers, *cheater_procs]  # restarted on death
    procs = [trainer, *helpers]
    stop_requested = {"sig": None}

    def on_signal(signum, _frame):
        stop_requested["sig"] = signum

    old = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    progress = Progress(cfg, run / "metrics.jsonl", cheat_kinds, orchestrator=url)
    cheat_s = f" + {len(cheater_procs)} cheaters ({', '.join(cheat_kinds)})" if cheat_kinds else ""
    print(
        f"swarmrl: run '{cfg.name}' in {run}: trainer + {len(relays)} relays + "
        f"{len(validators)} validators + {len(workers)} workers{cheat_s}; logs in {run / 'logs'}",
        flush=True,
    )
    orchestrator.start()
    try:
        _wait_healthy(url, orchestrator)
    except LaunchError:
        _stop_all([orchestrator], graceful=False)
        raise
    print(f"swarmrl: orchestrator at {url} (swarmrl status --orchestrator {url})", flush=True)
    # Extending a finished run (--resume with more steps): workers and validators would
    # see "done" and exit, so they start once the trainer has reopened the run.
    held = [*validators, *workers, *cheater_procs] if resume and _run_done(url) else []
    for p in procs:
        if p is not orchestrator and p not in held:
            p.start()
    code = 0
    ledger = None
    try:
        while True:
            time.sleep(min(cfg.launcher.progress_s, 0.5))
            if stop_requested["sig"] is not None:
                progress.close()
                print("swarmrl: interrupted; stopping all processes", flush=True)
                code = 130
                break
            rc = trainer.poll()
            if rc is not None:
                ledger = fetch_ledger(url)  # before the orchestrator stops with the rest
                progress.update(sum(w.poll() is None for w in workers))
                progress.close()
                if rc != 0:
                    print(
                        f"swarmrl: process 'trainer' failed with exit code {rc}; last lines of {trainer.log_path}:\n{_tail(trainer.log_path)}",
                        file=sys.stderr,
                        flush=True,
                    )
                    code = 1
                break
            if held and not _run_done(url):
                for p in held:
                    p.start()
                held = []
            failed = None
            for w in helpers:
                wrc = w.poll()
                if wrc is None or wrc == 0 or w.refused:  # 0: the run is done
                    continue
                if wrc == EXIT_REFUSED and w in (*workers, *cheater_procs):
                    w.refused = True  # ejected or banned: not restarted; the run goes on
                    print(
                        f"\nswarmrl: the orchestrator ejected '{w.name}' (see {w.log_path})",
                        flush=True,
                    )
                    continue
                if w.restarts >= cfg.launcher.max_worker_restarts:
                    failed = (w, wrc)
                    break
                w.restarts += 1
                print(
                    f"\nswarmrl: process '{w.name}' exited with code {wrc}; restarting ({w.restarts}/{cfg.launcher.max_worker_restarts})",
                    flush=True,
                )
                w.start()
            if failed:
                w, wrc = failed
                progress.close()
                print(
                    f"swarmrl: process '{w.name}' failed with exit code {wrc} after {w.restarts} restarts; last lines of {w.log_path}:\n{_tail(w.log_path)}",
                    file=sys.stderr,
                    flush=True,
                )
                code = 1
                break
            progress.update(sum(w.poll() is None for w in workers))
    finally:
        _stop_all(procs, graceful=code == 0)
        for s, h in old.items():
            signal.signal(s, h)
    if code == 0:
        for line in summary_lines(cfg, run, ledger):
            print(f"swarmrl: {line}")
    return code


def _stop_all(procs: list[Proc], graceful: bool, grace_s: float = GRACE_S) -> None:
    if graceful:  # workers exit by themselves once the trainer reports done
        deadline = time.time() + GRACE_S
        while time.time() < deadline and any(p.poll() is None for p in procs if p.exits_when_done):
            time.sleep(0.1)
    for p in procs:
        p.signal(signal.SIGTERM)
    deadline = time.time() + grace_s
    while time.time() < deadline and any(p.poll() is None for p in procs):
        time.sleep(0.1)
    for p in procs:
        p.signal(signal.SIGKILL)
        if p.popen:
            p.popen.wait()
        if p.logf:
            p.logf.close()
