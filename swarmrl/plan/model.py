"""The protocol as a discrete-event model (simpy): what a swarm of a given shape does
with given costs, without running it.

What is modelled, as the code does it (orchestrator/work.py, trainer/loop.py):

- the trainer collects, for step n, accepted files whose policy is at least
  n - async_level, the oldest policy first, until `batch_groups` groups with
  signal are in (a group has signal with probability `Costs.signal`; the rest are
  dropped, extra groups carry over); after `collect_s` (its last file's download,
  check and consumption) step n + 1 opens to the workers, and n trains
  (`train_s`) while they work; version n is published `publish_s` later, in
  order, from a second thread; files on their way with an older policy than a
  step takes become stale;
- a worker asks for work when it has a version and has finished a file; it gets
  an assignment while the groups out (open assignments and files on their way,
  with a fresh policy) stay within `max_pending_groups`, and only if its file
  would be fresh for the step it is queued for (`assign = "pipelined"`: behind
  the groups out, at the least a recent step took; orchestrator/work.py) or, by the rule before
  (`assign = "slack"`), if the version it holds leaves `work_slack_steps` before
  its file would be stale; told to wait, it asks again as its AskPacer says
  (inference/pacing.py). It generates
  the file (`file_s` core-seconds), uploads it on its link and submits it
  (`submit_s`); the orchestrator spends `orchestrator_s` on each file's
  requests; a share `sample_rate` of files waits for a validator (`validate_s`,
  seen at its next poll if it was idle), the rest are accepted at once;
- each published version goes down the relay tree: the first level fetches it
  from the origin, each later level from the level above, and every worker and
  validator from the last level, all at once (relays pass shards on as they
  arrive: a level ends no sooner than the one above it), each transfer on the
  sender's uplink (one pool per level) and capped by the receiver's link
  (plan/fluid.py), after `fetch_latency_s` (the requests before the bytes) and
  beside the node's CPU on what arrives (`fetch_s_per_mb`) and the relays'
  (`relay_s_per_mb`); a node then takes it in (`load_s`) and works on it for its
  next assignment; its weights lag is the time from publication to the
  download's end, as the SHARDCAST client logs it;
- on one shared machine (`host_cores`, the emulated swarm on this machine) every
  process is a cgroup of its own (its role's weight, a worker's share of a core
  as its cap) and all its compute shares that cgroup; every live worker also
  burns `idle_cores` (its heartbeats, polls, threads), and a worker (re)starting
  spends `start_s`; otherwise every node computes on a device of its own;
- events by step: workers joining late, workers killed and back after a pause,
  the orchestrator down for a while (no assignments, no submissions).

Not modelled: the orchestrator's queueing and the requests' round trips beyond
the measured latencies above (its load is reported as requests per second and its
CPU as `orchestrator_s` a file), cheaters and the work their files waste,
validators' and relays' deaths (the stall while nodes under a killed relay move
to another), the faster-first rule and probation, the curriculum (signal is one
fixed share).
"""

from __future__ import annotations

import math
import random
import statistics

import simpy

from swarmrl.orchestrator.queue import WORTH_STEPS
from swarmrl.plan.fluid import Fluid
from swarmrl.plan.spec import Costs, Outcome, Swarm, Workers

__all__ = ["Costs", "Outcome", "Swarm", "Workers", "simulate"]


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
        self.steps_done: list[tuple[float, float]] = []  # (end, update seconds)
        self.staleness: dict[str, int] = {}
        self.carry = 0
        self.consumed: dict[int, int] = {}  # step -> groups consumed for it
        self.waited: dict[str, float] = {}  # worker-seconds told to wait, by reason
        origin = swarm.origin_mbit / 8
        self.pools = [Fluid(self.env, origin, "origin")] + [
            Fluid(self.env, n * swarm.relay_mbit / 8, f"relays {i + 1}")
            for i, n in enumerate(swarm.relays)
            if n
        ]
        self.holders: list[dict] = []  # nodes that take versions: {"mbit", "version", "cores"}
        self.procs: list[simpy.Process] = []
        # one thread updates, another publishes (shardcast/origin.py): a core each
        self.trainer_node = self.node("trainer", cores=2.0)
        self.publishing: simpy.Process | None = None
        self.orchestrator = self.node("orchestrator", cores=1.0)
        self.relays = [[self.node("relay") for _ in range(n)] for n in swarm.relays if n]

    # compute and transfers

    def node(self, role: str, cores: float = 1.0, speed: float = 1.0, mbit: float = 0.0) -> dict:
        """A process: on a shared machine, a cgroup of its own (its share of a core
        and its role's weight) that all its compute joins."""
        group = None
        if self.cpu is not None:
            group = self.cpu.group(cap=cores, weight=self.s.weights.get(role, 1024.0))
        return {"role": role, "cores": cores, "speed": speed, "mbit": mbit, "group": group,
                "version": 0, "alive": True, "changed": self.env.event(), "file": None,
                "pace": self.s.ask_poll_s, "asked": 0}  # fmt: skip

    def compute(self, core_s: float, node: dict, what: str = "", threads: float = math.inf):
        """`core_s` core-seconds of `node`'s on at most `threads` cores: on the shared
        machine within its cgroup, else on its own device at its speed."""
        if self.cpu is not None:
            tag = f"{node['role']} {what}".strip()
            return self.cpu.use(core_s, cap=threads, group=node["group"], tag=tag)
        return self.env.timeout(core_s / node["speed"])

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
        (shardcast/relay.py), so a level ends no sooner than its own transfers, the
        level above it and, on a shared machine, the CPU its relays spend taking the
        version in and the CPU the relays above spend sending it (`relay_s_per_mb`),
        whichever ends last."""
        t0 = self.env.now
        mb = self.c.version_mb
        above = None
        senders: list[dict] = []  # the level above's relays
        levels = [n for n in self.s.relays if n]
        for level, n in enumerate(levels, start=1):
            own = [self.fetch(level - 1, mb, self.s.relay_mbit) for _ in range(n)]
            own += self.relay_cpu(senders, mb * n) + self.relay_cpu(self.relays[level - 1], mb)
            above = simpy.AllOf(self.env, own + ([above] if above is not None else []))
            self.env.process(self._level_lag(str(level), n, above, t0))
            senders = self.relays[level - 1]
        takers = [node for node in self.holders if node["alive"]]
        if above is not None:
            above = simpy.AllOf(self.env, [above, *self.relay_cpu(senders, mb * len(takers))])
        last = len(self.pools) - 1
        for node in takers:
            self.env.process(self.take(node, version, last, t0, above))
        yield self.env.timeout(0)

    def relay_cpu(self, relays: list[dict], mb: float) -> list[simpy.Event]:
        """`relays` each handling their share of `mb` (on a shared machine)."""
        if self.cpu is None or not relays or self.c.relay_s_per_mb <= 0:
            return []
        each = self.c.relay_s_per_mb * mb / len(relays)
        return [self.compute(each, r, "relay") for r in relays]

    def _level_lag(self, level: str, n: int, done: simpy.Event, t0: float):
        yield done
        self.lags.setdefault(level, []).extend([self.env.now - t0] * n)

    def take(self, node: dict, version: int, level: int, t0: float | None, above=None):
        if self.c.fetch_latency_s > 0:
            yield self.env.timeout(self.c.fetch_latency_s)
        cpu = self.c.version_mb * self.c.fetch_s_per_mb  # side by side with the transfer
        parts = [self.fetch(level, self.c.version_mb, node["mbit"]),
                 self.compute(cpu, node, "fetch")]  # fmt: skip
        if above is not None and not above.processed:
            parts.append(above)  # its relays cannot finish before their own upstream
        yield simpy.AllOf(self.env, parts)
        if t0 is not None:  # a version broadcast, not one fetched on (re)joining
            self.lags.setdefault("nodes", []).append(self.env.now - t0)
        yield self.compute(self.c.load_s, node, "load")
        if version > node["version"]:
            node["version"] = version
            if not node["changed"].triggered:
                node["changed"].succeed()

    # the trainer

    def trainer(self):
        s, c = self.s, self.c
        n = 1  # the step being collected and trained; self.step is the one open to workers
        while n <= s.steps:
            oldest = n - s.async_level
            self.expire(oldest)
            have = self.carry
            used: list[_File] = []
            while have < s.batch_groups:
                # in key order (trainer/batch.py): the oldest policy first
                fresh = sorted((f for f in self.accepted if f.policy >= oldest),
                               key=lambda f: f.policy)  # fmt: skip
                for f in fresh:
                    self.accepted.remove(f)
                    signal = sum(self.rng.random() < c.signal for _ in range(f.groups))
                    self.files["dropped_no_signal"] = self.files.get("dropped_no_signal", 0)
                    self.files["dropped_no_signal"] += f.groups - signal
                    have += signal
                    used.append(f)
                    if have >= s.batch_groups:
                        break  # consumed once read: after `collect_s`, below
                    self.consume(f, n)  # read: no longer out (the orchestrator's `consumed`)
                if have < s.batch_groups:
                    self.arrived = self.env.event()
                    yield self.arrived
            # its next poll for files, the last file's download, check and consumption: its
            # seconds where it had a core to itself, spent as CPU (it slows with the machine)
            yield self.compute(c.collect_s, self.trainer_node, "collect", threads=1.0)
            self.consume(used[-1], n)
            self.carry = have - s.batch_groups
            for f in used:
                self.finish(f, "trained")
                lag = str(n - f.policy)
                self.staleness[lag] = self.staleness.get(lag, 0) + 1
            # step n + 1 opens as soon as n's batch is in, and workers start on it while
            # n trains (trainer/loop.py): an older policy's work no longer counts
            self.step = n + 1
            start = self.env.now
            yield self.compute(c.train_s, self.trainer_node, "update", threads=1.0)
            self.steps_done.append((self.env.now, self.env.now - start))
            self.publishing = self.env.process(self.publish(n, self.publishing))
            n += 1
        yield self.publishing
        self.done = True
        for p in self.procs:
            if p.is_alive:
                p.interrupt("done")

    def publish(self, version: int, before):
        """On the trainer's background thread, in order: save, hash and sign the
        version (`publish_s`), then send it down the tree."""
        if before is not None:
            yield before
        yield self.compute(self.c.publish_s, self.trainer_node, "publish", threads=1.0)
        self.published[version] = self.env.now
        self.env.process(self.broadcast(version))
        if not self.new_version.triggered:
            self.new_version.succeed()
        self.new_version = self.env.event()

    def expire(self, oldest: int) -> None:
        for f in [f for f in self.on_the_way if f.policy < oldest]:
            self.finish(f, "stale")
            if f in self.accepted:
                self.accepted.remove(f)

    def pace(self, node: dict, until_new_version: bool = False):
        """A worker told to wait (worker's AskPacer, inference/pacing.py): it asks again
        after its pace, `ask_poll_s` doubling with each such answer up to the
        heartbeat period, back to `ask_poll_s` after an assignment; cut short, at its
        next `ask_poll_s` tick, when a version newer than the one it asked with has
        arrived. `until_new_version` (told its policy is stale: only a newer version
        changes that answer): the asks until one arrives are counted, not simulated."""
        most = max(self.s.ask_poll_s, self.s.heartbeat_s)
        total, tick, t0 = node["pace"], self.s.ask_poll_s, self.env.now
        if node["version"] > node["asked"]:
            node["pace"] = min(2 * total, most)
            return
        node["changed"] = self.env.event()
        if until_new_version:
            yield node["changed"]
        else:
            yield node["changed"] | self.env.timeout(total)
        waited = self.env.now - t0
        while waited >= total:  # each pause that ran out ended in an ask told to wait
            waited -= total
            total = min(2 * total, most)
        node["pace"] = min(2 * total, most)
        if node["changed"].triggered:
            yield self.env.timeout(min(total, math.ceil(waited / tick) * tick) - waited)

    def consume(self, f: _File, step: int) -> None:
        self.consumed[step] = self.consumed.get(step, 0) + f.groups
        if f.state == "on_the_way":
            self.out[f.policy] -= f.groups
            self.on_the_way.remove(f)
            f.state = "consumed"

    def finish(self, f: _File, state: str) -> None:
        if f.state in ("open", "on_the_way"):
            self.out[f.policy] -= f.groups
        if f in self.on_the_way:
            self.on_the_way.remove(f)
        f.state = state
        self.files[state] = self.files.get(state, 0) + 1

    def outstanding(self) -> int:
        oldest = self.step - self.s.async_level
        return sum(g for p, g in self.out.items() if p >= oldest)

    def queued_for(self, policy: int) -> int:
        """The step a file of `policy` assigned now would be taken for, as the
        orchestrator estimates it (orchestrator/queue.py, `queued_for`)."""
        step = self.step
        taken = [self.consumed[k] for k in range(step - WORTH_STEPS, step) if k in self.consumed]
        now, ahead = self.consumed.get(step, 0), self.outstanding()
        if ahead == 0 and policy >= max(self.published):
            return step
        per_step = min(taken) if taken else self.s.batch_groups
        return step + (now + ahead) // max(per_step, now + 1 if now > per_step else 1)

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
                if not self.orchestrator_up:
                    yield self.env.timeout(s.heartbeat_s)
                    continue
                node["asked"] = node["version"]
                # "stale-policy", "late-for-its-step" (its file would be stale when taken),
                # "enough-work" (the cap on the work out, or the budget's steps are covered)
                late = False
                full = self.outstanding() > limit
                if s.assign == "pipelined":
                    stale = self.step - node["version"] > s.async_level
                    at = self.queued_for(node["version"])
                    late = not stale and at - node["version"] > s.async_level
                    full = full or at > s.steps
                else:
                    stale = self.step - node["version"] > max(1, s.async_level - s.work_slack_steps)
                if stale or late or full:
                    t0 = self.env.now
                    yield from self.pace(node, until_new_version=stale)
                    why = (
                        "stale-policy" if stale else "late-for-its-step" if late else "enough-work"
                    )
                    self.waited[why] = self.waited.get(why, 0.0) + self.env.now - t0
                    continue
                node["pace"] = s.ask_poll_s
                f = _File(node["version"], s.groups_per_file)
                self.out[f.policy] = self.out.get(f.policy, 0) + f.groups
                node["file"] = f
                node["job"] = self.compute(self.per_file(c.file_s), node, "file")
                yield node["job"]
                node["job"] = None
                node["job"] = self.compute(self.per_file(c.submit_s), node, "submit")
                yield simpy.AllOf(self.env, [node["job"], self.env.timeout(c.file_mb * 8 / w.mbit)])
                node["job"] = None
                while not self.orchestrator_up:
                    yield self.env.timeout(s.heartbeat_s)
                self.requests += 3  # an upload URL, the upload, the submission
                self.compute(c.orchestrator_s, self.orchestrator, "requests")  # not awaited
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
            node["idle"] = self.cpu.use(
                math.inf, cap=self.c.idle_cores, group=node["group"], tag="worker idle"
            )

    def restart(self, node: dict, down_s: float):
        """A worker that was away `down_s` starts (`start_s`), takes the newest version."""
        node["file"] = None
        yield self.env.timeout(down_s)
        node["alive"] = True
        yield self.compute(self.c.start_s, node, "start")
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

    def validator(self, node: dict):
        while True:
            idle = not self.validate.items
            f = yield self.validate.get()
            if idle:  # it sees the file at its next poll
                yield self.env.timeout(self.rng.uniform(0, self.s.validator_poll_s))
            start = self.env.now
            yield self.compute(self.per_file(self.c.validate_s), node, "check")
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
            node = run.node("worker", w.cores, w.speed, w.mbit)
            run.holders.append(node)
            if w.join_step == 0:
                run.idle(node)
            proc = env.process(run.worker(w, node))
            run.procs.append(proc)
            workers.append((w, node, proc))
    for _ in range(swarm.validators):
        node = run.node("validator", mbit=swarm.validator_mbit)
        run.holders.append(node)
        env.process(run.validator(node))
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
        cpu_s={k: round(v, 1) for k, v in sorted(run.cpu.used_by.items())} if run.cpu else {},
        worker_wait_s={k: round(v, 1) for k, v in sorted(run.waited.items())},
    )


def _quantiles(xs: list[float]) -> dict[str, float]:
    xs = sorted(xs)
    return {"p50": round(statistics.median(xs), 2),
            "p99": round(xs[min(len(xs) - 1, int(0.99 * len(xs)))], 2)}  # fmt: skip
