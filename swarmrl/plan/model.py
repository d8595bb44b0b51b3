"""The protocol as a discrete-event model (simpy): what a swarm of a given shape does
with given costs, without running it.

What is modelled, as the code does it (orchestrator/work.py, trainer/loop.py):

- the trainer collects, for step s, accepted files whose policy is at least
  s - async_level, until `batch_groups` groups with signal are in (a group has
  signal with probability `Costs.signal`; the rest are dropped, extra groups carry
  over); it then trains (`Costs.train_s` core-seconds) and publishes version s;
  files still on their way with an older policy become stale;
- a worker asks for work when it has finished a file, then every heartbeat; it gets
  an assignment while the groups out (open assignments and files on their way,
  with a fresh policy) stay within `max_pending_groups`, and only if the version it
  holds leaves `work_slack_steps` before its file would be stale; it generates the file (`file_s` core-
  seconds), uploads it on its link and submits it (`submit_s` core-seconds: signing,
  hashing, the requests); a share `sample_rate` of files
  waits for one of the validators (`validate_s` core-seconds each), the rest are
  accepted at once;
- each published version goes down the relay tree: the first level fetches it
  from the origin, each later level from the level above, and every worker and
  validator from the last level, all at once (relays pass shards on as they
  arrive: a level ends no sooner than the one above it), each transfer on
  the sender's uplink (one pool per level) and capped by the receiver's link
  (plan/fluid.py), while the node's CPU checks what arrives (`fetch_s_per_mb`
  core-seconds per MB); a node then takes it in (`load_s` core-seconds) and works on
  it for its next assignment; its weights lag is the time from publication to
  the download's end, as the SHARDCAST client logs it;
- on one shared machine (`host_cores`, the emulated swarm on this machine) every
  piece of compute shares those cores by weight, each node capped at its share,
  and every live worker also burns `idle_cores` (its heartbeats, polls, threads);
  otherwise every node computes on a device of its own;
- events by step: workers joining late, workers killed and back after a pause,
  the orchestrator down for a while (no assignments, no submissions).

Not modelled: request round trips and the orchestrator's own queueing (its load is
reported as requests per second and, at a measured service time, its use of one
core), cheaters and the work their files waste, validators' and relays' deaths,
the faster-first rule, the curriculum (signal is one fixed share).
"""

from __future__ import annotations

import math
import random
import statistics
from collections import deque
from dataclasses import dataclass, field

import simpy

from swarmrl.plan.fluid import Fluid


@dataclass
class Costs:
    """Measured costs (`swarmrl plan --calibrate` measures them on this machine)."""

    file_s: float  # core-seconds to generate one file (of `groups` groups) on the reference device
    train_s: float  # core-seconds of one trainer update
    validate_s: float  # core-seconds to check one file (of `groups` groups)
    load_s: float  # core-seconds for a node to take in a version it downloaded
    version_mb: float  # what one version sends down the tree (full, or a patch)
    start_s: float = 0.0  # seconds from a worker's start to its asking for work
    fetch_s_per_mb: float = 0.0  # core-seconds a node spends per MB it downloads (checks)
    idle_cores: float = 0.0  # what a worker process burns besides its files (heartbeats...)
    submit_s: float = 0.0  # core-seconds from a file generated to its submission (upload)
    file_mb: float = 0.05  # one rollout file
    signal: float = 1.0  # share of groups with signal
    request_ms: float = 2.0  # the orchestrator's service time for one request
    groups: int = 2  # groups in the files file_s and validate_s were measured on
    measured_on: str = ""


@dataclass
class Workers:
    """A set of alike workers."""

    count: int
    mbit: float
    speed: float = 1.0  # the reference device's speed times this (its own device)
    cores: float = 1.0  # the share of a core it may use on a shared machine
    join_step: int = 0  # it joins when the trainer reaches this step


@dataclass
class Swarm:
    workers: list[Workers]
    steps: int = 12
    batch_groups: int = 16
    groups_per_file: int = 2
    async_level: int = 2
    max_pending_groups: int = 0  # 0: batch_groups
    work_slack_steps: int = 1  # orchestrator.work_slack_steps
    relays: list[int] = field(default_factory=lambda: [1])  # relays per level
    relay_mbit: float = 100.0
    origin_mbit: float = 100.0
    validators: int = 1
    validator_mbit: float = 100.0
    sample_rate: float = 0.1
    heartbeat_s: float = 2.0
    host_cores: float | None = None  # all compute on one machine of this many cores
    weights: dict[str, float] = field(default_factory=dict)  # role -> cpu.shares
    churn: list[tuple[int, float, float]] = field(default_factory=list)  # step, share, down s
    orchestrator_down: tuple[int, float] | None = None  # step, seconds
    seed: int = 0


@dataclass
class Outcome:
    steps: int
    wall_s: float
    trainer_busy_fraction: float
    trainer_idle_s: float
    step_s_p50: float
    files: dict[str, int]
    stale_fraction: float
    weights_lag_s: dict[str, dict[str, float]]
    origin_mb: float
    delivered_mb: float
    validator_use: float
    validator_backlog_max: int
    orchestrator_requests_per_s: float
    orchestrator_core_use: float
    staleness_histogram: dict[str, int]

    def as_dict(self) -> dict:
        return dict(self.__dict__)


class _File:
    __slots__ = ("policy", "groups", "state")

    def __init__(self, policy: int, groups: int):
        self.policy, self.groups, self.state = policy, groups, "open"


class _Run:
    def __init__(self, swarm: Swarm, costs: Costs):
        self.s, self.c = swarm, costs
        self.env = simpy.Environment()
        self.rng = random.Random(swarm.seed)
        self.cpu = Fluid(self.env, swarm.host_cores, "host") if swarm.host_cores else None
        self.step = 1
        self.done = False
        self.published: dict[int, float] = {0: 0.0}
        self.new_version = self.env.event()
        self.accepted: list[_File] = []
        self.arrived = self.env.event()
        self.out: dict[int, int] = {}  # policy -> groups out
        self.on_the_way: list[_File] = []
        self.files: dict[str, int] = {}
        self.lags: dict[str, list[float]] = {}
        self.mb = {"origin": 0.0, "delivered": 0.0}
        self.validate = simpy.Store(self.env)
        self.backlog_max = 0
        self.validator_busy = 0.0
        self.orchestrator_up = True
        self.requests = 0
        self.waiting: deque[simpy.Event] = deque()  # workers told "enough-work", in turn
        self.steps_done: list[tuple[float, float]] = []  # (end, update seconds)
        self.staleness: dict[str, int] = {}
        self.carry = 0
        origin = swarm.origin_mbit / 8
        self.pools = [Fluid(self.env, origin, "origin")] + [
            Fluid(self.env, n * swarm.relay_mbit / 8, f"relays {i + 1}")
            for i, n in enumerate(swarm.relays)
            if n
        ]
        self.holders: list[dict] = []  # nodes that take versions: {"mbit", "version", "cores"}
        self.procs: list[simpy.Process] = []

    # compute and transfers

    def compute(self, core_s: float, cores: float, role: str, speed: float = 1.0):
        if self.cpu is not None:
            weight = self.s.weights.get(role, 1024.0)
            return self.cpu.use(core_s, cap=cores, weight=weight)
        return self.env.timeout(core_s / speed)

    def per_file(self, seconds: float) -> float:
        """A cost measured on files of `Costs.groups` groups, for this swarm's files."""
        return seconds * self.s.groups_per_file / max(1, self.c.groups)

    def cancel(self, job) -> None:
        if self.cpu is not None and job is not None:
            self.cpu.cancel(job)

    def fetch(self, level: int, mb: float, mbit: float):
        if level == 0:
            self.mb["origin"] += mb
        self.mb["delivered"] += mb
        return self.pools[level].use(mb, cap=mbit / 8)

    # the tree

    def broadcast(self, version: int):
        """Every level fetches at once: a relay serves shards while they arrive
        (shardcast/relay.py), so a level ends no sooner than its own transfers and
        the level above it, whichever ends last."""
        t0 = self.env.now
        mb = self.c.version_mb
        above = None
        for level, n in enumerate(self.s.relays, start=1):
            if not n:
                continue
            own = [self.fetch(level - 1, mb, self.s.relay_mbit) for _ in range(n)]
            above = simpy.AllOf(self.env, own + ([above] if above is not None else []))
            self.env.process(self._level_lag(str(level), n, above, t0))
        last = len(self.pools) - 1
        for node in list(self.holders):
            if node["alive"]:
                self.env.process(self.take(node, version, last, t0, above))
        yield self.env.timeout(0)

    def _level_lag(self, level: str, n: int, done: simpy.Event, t0: float):
        yield done
        self.lags.setdefault(level, []).extend([self.env.now - t0] * n)

    def take(self, node: dict, version: int, level: int, t0: float | None, above=None):
        cpu = self.c.version_mb * self.c.fetch_s_per_mb  # side by side with the transfer
        parts = [self.fetch(level, self.c.version_mb, node["mbit"]),
                 self.compute(cpu, node["cores"], node["role"], node["speed"])]  # fmt: skip
        if above is not None and not above.processed:
            parts.append(above)  # its relays cannot finish before their own upstream
        yield simpy.AllOf(self.env, parts)
        if t0 is not None:  # a version broadcast, not one fetched on (re)joining
            self.lags.setdefault("nodes", []).append(self.env.now - t0)
        yield self.compute(self.c.load_s, node["cores"], node["role"], node["speed"])
        if version > node["version"]:
            node["version"] = version
            if not node["changed"].triggered:
                node["changed"].succeed()

    # the trainer

    def trainer(self):
        s, c = self.s, self.c
        while self.step <= s.steps:
            oldest = self.step - s.async_level
            self.expire(oldest)
            have = self.carry
            used: list[_File] = []
            while have < s.batch_groups:
                fresh = [f for f in self.accepted if f.policy >= oldest]
                for f in fresh:
                    self.accepted.remove(f)
                    signal = sum(self.rng.random() < c.signal for _ in range(f.groups))
                    self.files["dropped_no_signal"] = self.files.get("dropped_no_signal", 0)
                    self.files["dropped_no_signal"] += f.groups - signal
                    have += signal
                    used.append(f)
                    self.consume(f)  # read: no longer out (the orchestrator's `consumed`)
                    if have >= s.batch_groups:
                        break
                if have < s.batch_groups:
                    self.arrived = self.env.event()
                    yield self.arrived
            self.carry = have - s.batch_groups
            for f in used:
                self.finish(f, "trained")
                lag = str(self.step - f.policy)
                self.staleness[lag] = self.staleness.get(lag, 0) + 1
            start = self.env.now
            yield self.compute(c.train_s, 1.0, "trainer")
            self.steps_done.append((self.env.now, self.env.now - start))
            self.published[self.step] = self.env.now
            self.env.process(self.broadcast(self.step))
            self.step += 1
            self.wake()  # an older policy's work no longer counts
            if not self.new_version.triggered:
                self.new_version.succeed()
            self.new_version = self.env.event()
        self.done = True
        for p in self.procs:
            if p.is_alive:
                p.interrupt("done")

    def expire(self, oldest: int) -> None:
        for f in [f for f in self.on_the_way if f.policy < oldest]:
            self.finish(f, "stale")
            if f in self.accepted:
                self.accepted.remove(f)

    def wake(self) -> None:
        """Room for more work: the waiting workers that it fits are let in, each after
        the time until the first of the waiting ones heartbeats again (a heartbeat
        every `heartbeat_s` at a random phase: on average heartbeat_s / (n + 1))."""
        s = self.s
        room = (s.max_pending_groups or s.batch_groups) - self.outstanding()
        for _ in range(min(len(self.waiting), max(0, room // s.groups_per_file))):
            wake = self.waiting.popleft()
            delay = self.rng.uniform(0, 2 * s.heartbeat_s / (len(self.waiting) + 2))
            self.env.process(self._later(wake, delay))

    def _later(self, event: simpy.Event, delay: float):
        yield self.env.timeout(delay)
        if not event.triggered:
            event.succeed()

    def consume(self, f: _File) -> None:
        if f.state == "on_the_way":
            self.out[f.policy] -= f.groups
            self.on_the_way.remove(f)
            f.state = "consumed"
            self.wake()

    def finish(self, f: _File, state: str) -> None:
        if f.state in ("open", "on_the_way"):
            self.out[f.policy] -= f.groups
            self.wake()
        if f in self.on_the_way:
            self.on_the_way.remove(f)
        f.state = state
        self.files[state] = self.files.get(state, 0) + 1

    def outstanding(self) -> int:
        oldest = self.step - self.s.async_level
        return sum(g for p, g in self.out.items() if p >= oldest)

    # workers and validators

    def worker(self, w: Workers, node: dict):
        s, c = self.s, self.c
        limit = (s.max_pending_groups or s.batch_groups) - s.groups_per_file
        if w.join_step > 0:
            node["alive"] = False
            while self.step < w.join_step:
                yield self.new_version
            yield from self.restart(node, 0.0)
        while not self.done:
            try:
                if self.step - node["version"] > max(1, s.async_level - s.work_slack_steps):
                    node["changed"] = self.env.event()
                    yield node["changed"]
                    continue
                if not self.orchestrator_up:
                    yield self.env.timeout(s.heartbeat_s)
                    continue
                if self.outstanding() > limit:
                    wake = self.env.event()  # "enough-work": asks again when room frees
                    self.waiting.append(wake)
                    yield wake
                    continue
                f = _File(node["version"], s.groups_per_file)
                self.out[f.policy] = self.out.get(f.policy, 0) + f.groups
                node["file"] = f
                node["job"] = self.compute(self.per_file(c.file_s), w.cores, "worker", w.speed)
                yield node["job"]
                node["job"] = None
                node["job"] = self.compute(self.per_file(c.submit_s), w.cores, "worker", w.speed)
                yield simpy.AllOf(self.env, [node["job"], self.env.timeout(c.file_mb * 8 / w.mbit)])
                node["job"] = None
                while not self.orchestrator_up:
                    yield self.env.timeout(s.heartbeat_s)
                self.requests += 3  # an upload URL, the upload, the submission
                node["file"] = None
                self.files["generated"] = self.files.get("generated", 0) + 1
                if f.state != "open":
                    continue  # stale meanwhile
                f.state = "on_the_way"
                self.on_the_way.append(f)
                if self.rng.random() < s.sample_rate:
                    self.validate.put(f)
                    self.backlog_max = max(self.backlog_max, len(self.validate.items))
                else:
                    self.accept(f)
            except simpy.Interrupt as why:
                f = node.pop("file", None)
                if f is not None and f.state == "open":
                    self.out[f.policy] -= f.groups  # orphaned, then given to another
                    self.wake()
                    f.state = "orphaned"
                self.cancel(node.pop("job", None))
                self.cancel(node.pop("idle", None))
                if why.cause == "done":
                    return
                node["alive"] = False
                yield from self.restart(node, why.cause)

    def idle(self, node: dict) -> None:
        """On a shared machine, a live worker burns `idle_cores` besides its files."""
        if self.cpu is not None and self.c.idle_cores > 0:
            weight = self.s.weights.get(node["role"], 1024.0)
            cap = min(self.c.idle_cores, node["cores"])  # within the node's own share
            node["idle"] = self.cpu.use(math.inf, cap=cap, weight=weight)

    def restart(self, node: dict, down_s: float):
        """A worker that was away `down_s` starts (`start_s`), takes the newest version."""
        node["file"] = None
        yield self.env.timeout(down_s + self.c.start_s)
        node["alive"] = True
        self.idle(node)
        node["version"] = -math.inf
        node["changed"] = self.env.event()
        newest = max(self.published)
        self.env.process(self.take(node, newest, len(self.pools) - 1, None))

    def accept(self, f: _File) -> None:
        if f.state != "on_the_way":
            return
        self.accepted.append(f)
        if not self.arrived.triggered:
            self.arrived.succeed()

    def validator(self):
        while True:
            f = yield self.validate.get()
            start = self.env.now
            yield self.compute(self.per_file(self.c.validate_s), 1.0, "validator")
            self.validator_busy += self.env.now - start
            self.accept(f)

    # events

    def events(self, workers: list[tuple[Workers, dict, simpy.Process]]):
        s = self.s
        pending = sorted(s.churn)
        down = s.orchestrator_down
        while pending or down:
            yield self.new_version
            if pending and self.step >= pending[0][0]:
                _, share, pause = pending.pop(0)
                alive = [(n, p) for w, n, p in workers if n["alive"] and self.step >= w.join_step]
                for _, proc in alive[: max(1, round(share * len(workers)))]:
                    if proc.is_alive:
                        proc.interrupt(pause)
            if down and self.step >= down[0]:
                self.orchestrator_up = False
                yield self.env.timeout(down[1])
                self.orchestrator_up = True
                down = None


def simulate(swarm: Swarm, costs: Costs) -> Outcome:
    """Run the model (see the module's docstring) until the trainer's last step."""
    run = _Run(swarm, costs)
    env = run.env
    workers = []
    for w in swarm.workers:
        for _ in range(w.count):
            node = {"mbit": w.mbit, "version": 0, "cores": w.cores, "speed": w.speed,
                    "role": "worker", "alive": True, "changed": env.event(), "file": None}  # fmt: skip
            run.holders.append(node)
            if w.join_step == 0:
                run.idle(node)
            proc = env.process(run.worker(w, node))
            run.procs.append(proc)
            workers.append((w, node, proc))
    for _ in range(swarm.validators):
        run.holders.append({"mbit": swarm.validator_mbit, "version": 0, "cores": 1.0,
                            "speed": 1.0, "role": "validator", "alive": True,
                            "changed": env.event(), "file": None})  # fmt: skip
        env.process(run.validator())
    env.process(run.events(workers))
    trainer = env.process(run.trainer())
    env.run(until=trainer)
    ends = [t for t, _ in run.steps_done]
    span = ends[-1] - ends[0] if len(ends) > 1 else 0.0
    busy = sum(u for _, u in run.steps_done[1:])
    gaps = [b - a for a, b in zip(ends, ends[1:], strict=False)]
    files = {k: run.files.get(k, 0) for k in ("generated", "trained", "stale", "dropped_no_signal")}
    nodes = sum(w.count for w in swarm.workers) + swarm.validators
    heartbeats = nodes * env.now / swarm.heartbeat_s
    req_s = (run.requests + heartbeats) / env.now if env.now else 0.0
    return Outcome(
        steps=len(ends),
        wall_s=round(env.now, 1),
        trainer_busy_fraction=round(busy / span, 3) if span else 0.0,
        trainer_idle_s=round(span - busy, 1),
        step_s_p50=round(statistics.median(gaps), 2) if gaps else 0.0,
        files=files,
        stale_fraction=round(files["stale"] / files["generated"], 3) if files["generated"] else 0,
        weights_lag_s={k: _quantiles(v) for k, v in sorted(run.lags.items())},
        origin_mb=round(run.mb["origin"], 1),
        delivered_mb=round(run.mb["delivered"], 1),
        validator_use=round(run.validator_busy / (env.now * max(1, swarm.validators)), 3),
        validator_backlog_max=run.backlog_max,
        orchestrator_requests_per_s=round(req_s, 1),
        orchestrator_core_use=round(req_s * costs.request_ms / 1000, 3),
        staleness_histogram=dict(sorted(run.staleness.items())),
    )


def _quantiles(xs: list[float]) -> dict[str, float]:
    xs = sorted(xs)
    return {"p50": round(statistics.median(xs), 2),
            "p99": round(xs[min(len(xs) - 1, int(0.99 * len(xs)))], 2)}  # fmt: skip
