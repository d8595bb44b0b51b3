"""`swarmrl rl`: the whole swarm on one machine, one process per role.

The launcher starts the orchestrator first (and waits for its /health), then
the trainer (which is also the SHARDCAST origin), `shardcast.relays` relays,
the validators and N workers as separate processes. Every process talks to
the others only through the orchestrator's HTTP API and SHARDCAST; workers
are started exactly as a contributor elsewhere would start one
(`swarmrl worker --orchestrator URL --home DIR`), with no config file. This
module says which processes run and when each may be restarted; supervisor.py
runs them (each in its own session, told to die with the launcher, with torch
threads set per process so they share the cores), with one log file per
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
- `launcher.worker_niceness` is meant to run workers at a lower CPU priority
  (the trainer is the bottleneck of a swarm that shares one machine's cores),
  but it is not applied: every process runs at the launcher's priority (see
  launch/supervisor.py);
- Ctrl-C stops everything cleanly; `--resume` continues from the newest
  complete version.

Where each process runs is a `Placement`: `Local` (the default) puts every one on
this machine's configured hosts, with relays all fed by the origin; an emulated
network (sim/emulated.py) gives each its own address, a relay tree and a command
that runs inside its namespace.
"""

from __future__ import annotations

import json
import logging
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from swarmrl.config import RunConfig
from swarmrl.errors import EXIT_REFUSED, LaunchError
from swarmrl.launch import heldout
from swarmrl.launch.progress import Progress, fetch_ledger, summary_lines
from swarmrl.launch.supervisor import Action, Proc, Supervisor, free_port, stop_all, tail

log = logging.getLogger("swarmrl.launch.swarm")


class Placement(Protocol):
    """Where the processes of a swarm run (see the module's docstring)."""

    def host(self, name: str, default: str) -> str:
        """The address process `name` (orchestrator, trainer, relay-0, ...) listens on."""

    def port(self, name: str, host: str) -> int:
        """A port that is free for it there."""

    def upstream(self, index: int, origin: str, relays: list[str]) -> list[str]:
        """The URLs relay `index` mirrors from."""

    def servers(self, origin: str, relays: list[str]) -> list[str]:
        """The servers workers are told to fetch weights from."""

    def inner(self, index: int, count: int) -> bool:
        """Whether relay `index` of `count` serves only other relays (not registered
        with the orchestrator, so that workers are not sent to it)."""

    def relay_networks(self, cfg: RunConfig) -> list[str]:
        """Networks the orchestrator must accept its own relays' addresses from."""

    def wrap(self, proc: Proc) -> None:
        """Make `proc`'s command run where the process is placed."""


class Local:
    """Every process on this machine, at the configured hosts; every relay fed by the
    origin; workers fetch from all relays (or the origin when there are none)."""

    def host(self, name: str, default: str) -> str:
        return default

    def port(self, name: str, host: str) -> int:
        return free_port(host)

    def upstream(self, index: int, origin: str, relays: list[str]) -> list[str]:
        return [origin]

    def servers(self, origin: str, relays: list[str]) -> list[str]:
        return relays or [origin]

    def inner(self, index: int, count: int) -> bool:
        return False

    def relay_networks(self, cfg: RunConfig) -> list[str]:
        return _host_networks(cfg.shardcast.host)

    def wrap(self, proc: Proc) -> None:
        pass


def _shardcast_setup(cfg: RunConfig, base: list[str], cfg_args: list[str], place: Placement):
    """Key, ports and relay processes; returns (overrides for every process, the
    trainer's own overrides, relays)."""
    from swarmrl.protocol.identity import load_or_create_key, public_key_hex

    sc = cfg.shardcast
    paths = cfg.paths
    key = load_or_create_key(Path(sc.key_file) if sc.key_file else paths.keys / "trainer.key")
    origin_host = place.host("trainer", sc.host)
    origin_port = sc.origin_port or place.port("trainer", origin_host)
    origin_url = f"http://{origin_host}:{origin_port}"
    extra = [f"shardcast.origin_port={origin_port}", f"shardcast.public_key={public_key_hex(key)}"]
    own = [f"shardcast.host={json.dumps(origin_host)}"] if origin_host != sc.host else []
    relays, relay_urls = [], []
    for i in range(sc.relays):
        host = place.host(f"relay-{i}", sc.host)
        port = place.port(f"relay-{i}", host)
        upstream = ",".join(place.upstream(i, origin_url, relay_urls))
        relay_urls.append(f"http://{host}:{port}")
        argv = base + ["relay", "--upstream", upstream, "--host", host, "--port", str(port)]
        argv += ["--inner"] if place.inner(i, sc.relays) else []
        argv += ["--dir", str(paths.relays / f"relay-{i}"), *cfg_args, *extra]
        log_path = paths.logs / f"relay-{i}.log"
        restarts = cfg.launcher.max_worker_restarts
        relay = Proc(f"relay-{i}", argv, log_path, exits_when_done=False, max_restarts=restarts)
        relays.append(relay)
    if not sc.servers:
        extra.append("shardcast.servers=" + json.dumps(place.servers(origin_url, relay_urls)))
    return extra, own, relays


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


def _orchestrator_setup(
    cfg: RunConfig, base: list[str], cfg_args: list[str], nodes: list[str], place: Placement
):
    """The orchestrator process, its URL, and the overrides that point every process at it.
    The launcher's own relays, and its honest `nodes` unless `launcher.trust_own_workers`
    is off, get their keys here and are trusted (no probation, no proof of work); its
    cheaters are admitted as any new key is."""
    from swarmrl.orchestrator.server import operator_token
    from swarmrl.protocol.identity import load_or_create_key, public_key_hex
    from swarmrl.trainer.loop import trainer_key

    o = cfg.orchestrator
    host = place.host("orchestrator", o.host)
    port = o.port if o.url else place.port("orchestrator", host)
    url = o.url or f"http://{host}:{port}"
    operator_token(cfg)  # created before anyone needs it (mode 0600)
    extra = [f"orchestrator.url={json.dumps(url)}"]
    own = [f"orchestrator.port={port}"] + ([f"orchestrator.host={json.dumps(host)}"]
                                           if host != o.host else [])  # fmt: skip
    if not o.trainer_keys:
        own.append("orchestrator.trainer_keys=" + json.dumps([public_key_hex(trainer_key(cfg))]))
    # its dishonest workers (--cheaters) are strangers: they get nothing a new key would not
    # with launcher.trust_own_workers off, its honest workers are strangers too
    trust = cfg.launcher.trust_own_workers
    homes = [cfg.run_dir / "nodes" / n for n in nodes if trust and not n.startswith("cheater-")]
    if cfg.shardcast.enabled:  # its own relays too: they pay no proof of work
        homes += [cfg.paths.relays / f"relay-{i}" for i in range(cfg.shardcast.relays)]
    trusted = [public_key_hex(load_or_create_key(h / "node.key")) for h in homes]
    own.append("orchestrator.trusted_workers=" + json.dumps(list(o.trusted_workers) + trusted))
    if cfg.shardcast.enabled and cfg.shardcast.relays:  # its own relays register on this host
        own.append("orchestrator.relay_networks=" + json.dumps(
            list(o.relay_networks) + place.relay_networks(cfg)))  # fmt: skip
    argv = base + ["orchestrator", *cfg_args, *own, *extra]
    log_path = cfg.paths.logs / "orchestrator.log"
    restarts = cfg.launcher.max_worker_restarts  # on the same port, from its database
    proc = Proc("orchestrator", argv, log_path, exits_when_done=False, max_restarts=restarts)
    return proc, url, extra


def _host_networks(host: str) -> list[str]:
    """The addresses of `host` as single-address networks (its relays' URLs name it)."""
    import ipaddress

    from swarmrl.orchestrator.relays import resolve

    return sorted(str(ipaddress.ip_network(a)) for a in resolve(host))


def _wait_healthy(url: str, proc: Proc, timeout_s: float = 60.0) -> None:
    import httpx

    deadline = time.time() + timeout_s
    while time.time() < deadline:
        if proc.poll() is not None:
            raise LaunchError(
                f"the orchestrator exited with code {proc.poll()}; last lines of "
                f"{proc.log_path}:\n{tail(proc.log_path)}"
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


def _cheat_list(cheaters: int, cheats: list[str] | None, multi_turn: bool = False) -> list[str]:
    from swarmrl.sim.registry import CHEATS, MULTI_TURN_CHEATS, RL_CHEATS

    kinds = cheats or RL_CHEATS
    unknown = [c for c in kinds if c not in CHEATS]
    if unknown:
        raise LaunchError(f"unknown cheat(s) {unknown}; known: {', '.join(CHEATS)}")
    honest_here = [c for c in kinds if c in MULTI_TURN_CHEATS and not multi_turn]
    if cheaters and honest_here:
        raise LaunchError(
            f"cheat(s) {honest_here} game a run's tool environment, and this run has none "
            "([env] kind = 'none'): they would be honest workers"
        )
    if cheaters and not kinds:
        raise LaunchError("--cheats is empty")
    return [kinds[i % len(kinds)] for i in range(cheaters)]


@dataclass
class Swarm:
    """The processes of one local swarm, and the orchestrator's URL."""

    url: str
    orchestrator: Proc
    trainer: Proc
    relays: list[Proc]
    validators: list[Proc]
    workers: list[Proc]
    cheaters: list[Proc]

    @property
    def procs(self) -> list[Proc]:
        """All of them, in the order they are watched and stopped."""
        helpers = [*self.relays, *self.validators, *self.workers, *self.cheaters]
        return [self.trainer, self.orchestrator, *helpers]


def plan_swarm(
    cfg: RunConfig, config_path: str | None, overrides: list[str], resume: bool,
    cheat_kinds: list[str], place: Placement | None = None,
) -> Swarm:  # fmt: skip
    """Keys, ports and every process's command line, placed by `place` (default
    `Local`); starts nothing."""
    place = place or Local()
    run = cfg.run_dir
    base = [sys.executable, "-m", "swarmrl"]
    cfg_args = (["--config", config_path] if config_path else []) + list(overrides)
    relays: list[Proc] = []
    origin_own: list[str] = []
    if cfg.shardcast.enabled:
        extra, origin_own, relays = _shardcast_setup(cfg, base, cfg_args, place)
        cfg_args = cfg_args + extra
    cfg_args = cfg_args + _validator_setup(cfg)
    names = [f"worker-{i}" for i in range(cfg.launcher.workers)]
    names += [f"cheater-{i}" for i in range(len(cheat_kinds))]
    orchestrator, url, extra = _orchestrator_setup(cfg, base, cfg_args, names, place)
    cfg_args = cfg_args + extra
    for r in relays:
        r.argv += extra
    restarts = cfg.launcher.max_worker_restarts

    def proc(name: str, args: list[str], threads: int, **policy) -> Proc:
        return Proc(name, base + args + cfg_args, run / "logs" / f"{name}.log", threads, **policy)

    def node(name: str, cheat: str | None = None) -> Proc:
        argv = base + ["worker", "--orchestrator", url, "--home", str(run / "nodes" / name)]
        argv += ["--threads", str(cfg.worker.threads), "--device", cfg.worker.device]
        argv += ["--cheat", cheat] if cheat else []
        log_path = run / "logs" / f"{name}.log"
        return Proc(name, argv, log_path, cfg.worker.threads, cfg.launcher.worker_niceness,
                    max_restarts=restarts, final_codes=(EXIT_REFUSED,))  # fmt: skip

    trainer_args = ["trainer"] + (["--resume"] if resume else [])
    trainer = proc("trainer", trainer_args, cfg.trainer.threads, ends_run=True)
    trainer.argv += origin_own
    if cfg.trainer.ranks > 1:  # the same command, one process per rank under torchrun
        trainer.argv[1:3] = [
            "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
            str(cfg.trainer.ranks), "-m", "swarmrl",
        ]  # fmt: skip
    vthreads = cfg.validator.threads
    validators = [
        proc(f"validator-{i}", ["validator", "--index", str(i)], vthreads, max_restarts=restarts)
        for i in range(cfg.validator.count if cfg.validator.enabled else 0)
    ]
    workers = [node(f"worker-{i}") for i in range(cfg.launcher.workers)]
    cheaters = [node(f"cheater-{i}", k) for i, k in enumerate(cheat_kinds)]
    swarm = Swarm(url, orchestrator, trainer, relays, validators, workers, cheaters)
    for p in swarm.procs:
        place.wrap(p)
    return swarm


def _start(cfg: RunConfig, swarm: Swarm, resume: bool) -> list[Proc]:
    """Start the orchestrator, wait for it, then the rest; returns the processes held back."""
    swarm.orchestrator.start()
    try:
        _wait_healthy(swarm.url, swarm.orchestrator)
    except LaunchError:
        stop_all([swarm.orchestrator], graceful=False)
        raise
    url = swarm.url
    print(f"swarmrl: orchestrator at {url} (swarmrl status --orchestrator {url})", flush=True)
    if cfg.orchestrator.dashboard:
        token = cfg.orchestrator.operator_token_file or cfg.paths.keys / "operator.token"
        print(f"swarmrl: live dashboard at {url}/dashboard (rollout texts and admin actions: "
              f"the operator token in {token})", flush=True)  # fmt: skip
    heldout.share(cfg, cfg.run_dir, url, ("start_model",))
    # Extending a finished run (--resume with more steps): workers and validators would
    # see "done" and exit, so they start once the trainer has reopened the run.
    done = resume and _run_done(url)
    held = [*swarm.validators, *swarm.workers, *swarm.cheaters] if done else []
    for p in swarm.procs:
        if p is not swarm.orchestrator and p not in held:
            p.start()
    return held


class SwarmWatch:
    """What `swarmrl rl` shows and decides while its swarm runs (a supervisor.Watcher)."""

    def __init__(self, swarm: Swarm, progress: Progress, held: list[Proc]):
        self.swarm = swarm
        self.progress = progress
        self.held = held
        self.ledger: dict | None = None

    def _workers_alive(self) -> int:
        return sum(w.poll() is None for w in self.swarm.workers)

    def exited(self, proc: Proc, code: int, action: Action) -> int | None:
        if action == "end":  # the trainer
            self.ledger = fetch_ledger(self.swarm.url)  # before the orchestrator stops
            self.progress.update(self._workers_alive())
            self.progress.close()
            if code == 0:
                return 0
            print(
                f"swarmrl: process '{proc.name}' failed with exit code {code}; last lines of {proc.log_path}:\n{tail(proc.log_path)}",
                file=sys.stderr,
                flush=True,
            )
            return 1
        if action == "retire":  # ejected or banned: not restarted; the run goes on
            print(f"\nswarmrl: the orchestrator ejected '{proc.name}' (see {proc.log_path})",
                  flush=True)  # fmt: skip
            return None
        if action == "restart":
            print(
                f"\nswarmrl: process '{proc.name}' exited with code {code}; restarting ({proc.restarts}/{proc.max_restarts})",
                flush=True,
            )
            return None
        self.progress.close()
        print(
            f"swarmrl: process '{proc.name}' failed with exit code {code} after {proc.restarts} restarts; last lines of {proc.log_path}:\n{tail(proc.log_path)}",
            file=sys.stderr,
            flush=True,
        )
        return 1

    def round(self, seen: dict[str, int | None]) -> int | None:
        if self.held and not _run_done(self.swarm.url):
            for p in self.held:
                p.start()
            self.held = []
        self.progress.update(self._workers_alive())
        return None

    def interrupted(self, signum: int) -> int:
        self.progress.close()
        print("swarmrl: interrupted; stopping all processes", flush=True)
        return 130


def launch(
    cfg: RunConfig,
    config_path: str | None,
    overrides: list[str],
    resume: bool,
    fresh: bool,
    cheaters: int = 0,
    cheats: list[str] | None = None,
    place: Placement | None = None,
) -> int:
    from swarmrl.envs.environment import environment_of
    from swarmrl.launch.disk import check_disk
    from swarmrl.models.loading import resolve_model_path
    from swarmrl.trainer.lora import check_swarm

    started = time.time()
    check_swarm(cfg)
    resolve_model_path(cfg.model.path)  # fail before starting anything
    environment_of(cfg)  # an environment a validator could not recompute: refused now
    cheat_kinds = _cheat_list(cheaters, cheats, cfg.env.kind != "none")
    if cheat_kinds and not cfg.validator.enabled:
        raise LaunchError("--cheaters needs validator.enabled: nothing would stop them")
    run = prepare_run_dir(cfg, resume, fresh)
    swarm = plan_swarm(cfg, config_path, overrides, resume, cheat_kinds, place)
    workers = len(swarm.workers) + len(swarm.cheaters)
    check_disk(cfg, len(swarm.relays), len(swarm.validators), workers)  # before anything
    code = 1
    try:
        with Supervisor(swarm.procs) as supervisor:
            progress = Progress(cfg, run / "metrics.jsonl", cheat_kinds, orchestrator=swarm.url,
                                t0=started)  # fmt: skip
            _print_start(cfg, swarm, cheat_kinds)
            watch = SwarmWatch(swarm, progress, _start(cfg, swarm, resume))
            try:
                poll_s = min(cfg.launcher.progress_s, 0.5)
                time.sleep(poll_s)  # the first look comes one poll after the start
                code = supervisor.watch(poll_s, watch)
            finally:  # all but the orchestrator, which takes the final held-out score
                stop_all([p for p in swarm.procs if p is not swarm.orchestrator], code == 0)
        # out of the supervisor's signal handlers: Ctrl-C stops the scoring too. Both
        # policies are scored once the swarm is done: the check neither delays the first
        # step nor shares the cores with the swarm
        if code == 0:
            heldout.before(cfg, run, swarm.url)
            for line in summary_lines(cfg, run, watch.ledger, swarm.url, progress.first_step_s):
                print(f"swarmrl: {line}")
    finally:
        stop_all([swarm.orchestrator], graceful=code == 0)
    return code


def _print_start(cfg: RunConfig, swarm: Swarm, cheat_kinds: list[str]) -> None:
    run = cfg.run_dir
    cheat_s = f" + {len(swarm.cheaters)} cheaters ({', '.join(cheat_kinds)})" if cheat_kinds else ""
    print(
        f"swarmrl: run '{cfg.name}' in {run}: trainer + {len(swarm.relays)} relays + "
        f"{len(swarm.validators)} validators + {len(swarm.workers)} workers{cheat_s}; "
        f"logs in {run / 'logs'}",
        flush=True,
    )
