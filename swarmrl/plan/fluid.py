"""A capacity shared by the jobs running on it at once, on a simpy clock.

A link's bandwidth or a machine's cores: each job has an amount of work (bytes,
core-seconds), a cap (the most it can use: a client's own downlink, a worker's
share of a core) and a weight (1 for a TCP flow). At every moment the capacity is
split max-min fairly by weight, no job past its cap: the fluid picture of TCP flows
through one bottleneck and of CFS scheduling. Jobs may belong to a group (a node's
cgroup: its CFS quota is the group's cap, its `cpu.shares` the group's weight): the
capacity is then split among the groups first, and each group's rate among its
own jobs, as the kernel splits a core among cgroups and then among a cgroup's
threads. When a job starts or ends the split is computed again, and the next job
to finish is awaited. The model the planner builds (plan/model.py) puts its
downloads, its generation and its training on these.
"""

from __future__ import annotations

import math

import simpy


def split(capacity: float, jobs: list[tuple[float, float]]) -> list[float]:
    """Rates for jobs of (cap, weight): by weight, none past its cap, the capacity
    used up where the caps allow (water-filling, in order of cap per weight)."""
    rates = [0.0] * len(jobs)
    order = sorted(range(len(jobs)), key=lambda i: jobs[i][0] / jobs[i][1])
    left, weight = capacity, sum(w for _, w in jobs)
    for n, i in enumerate(order):
        cap, w = jobs[i]
        share = left / weight * w
        if cap > share:  # no job from here on is held by its cap
            for j in order[n:]:
                rates[j] = left / weight * jobs[j][1]
            return rates
        rates[i] = cap
        left -= cap
        weight -= w
    return rates


class Fluid:
    """`capacity` units per second, shared by the jobs of `use` (see the module)."""

    def __init__(self, env: simpy.Environment, capacity: float, name: str = ""):
        if not capacity > 0:
            raise ValueError(f"{name or 'a shared resource'}: capacity {capacity} must be > 0")
        self.env, self.capacity, self.name = env, capacity, name
        self.jobs: dict[simpy.Event, list] = {}  # done -> [left, cap, weight, rate, group, tag]
        self.groups: list[tuple[float, float]] = []  # (cap, weight)
        self.used = 0.0  # units served, for utilisation
        self.used_by: dict[str, float] = {}  # units served, by the jobs' tags
        self._last = env.now
        self._wake = env.event()
        env.process(self._serve())

    def group(self, cap: float = math.inf, weight: float = 1.0) -> int:
        """A share that jobs can join (`use(group=...)`): together they get at most
        `cap`, and claim the capacity with `weight` as one."""
        self.groups.append((cap, weight))
        return len(self.groups) - 1

    def use(
        self,
        amount: float,
        cap: float = math.inf,
        weight: float = 1.0,
        group: int | None = None,
        tag: str = "",
    ) -> simpy.Event:
        """An event that fires when `amount` units have been served to this job
        (`weight` ranks it within its group, if it has one)."""
        done = self.env.event()
        if amount <= 0:
            done.succeed()
            return done
        self._advance()
        self.jobs[done] = [amount, cap, weight, 0.0, group, tag]
        if not self._wake.triggered:
            self._wake.succeed()
        return done

    def cancel(self, done: simpy.Event) -> None:
        """Stop serving a job (its owner died); its event never fires."""
        self._advance()
        if self.jobs.pop(done, None) is not None and not self._wake.triggered:
            self._wake.succeed()

    def _advance(self) -> None:
        dt = self.env.now - self._last
        self._last = self.env.now
        if dt > 0:
            for job in self.jobs.values():
                job[0] -= job[3] * dt
                self.used += job[3] * dt
                self.used_by[job[5]] = self.used_by.get(job[5], 0.0) + job[3] * dt

    def _rates(self, jobs: list[list]) -> None:
        """Each job's rate: the capacity split among the groups (a job of no group
        is a group of its own), then each group's rate among its jobs."""
        if not self.groups:  # links: every job on its own
            for job, rate in zip(
                jobs, split(self.capacity, [(j[1], j[2]) for j in jobs]), strict=True
            ):
                job[3] = rate
            return
        members: dict[object, list[list]] = {}
        for n, job in enumerate(jobs):
            members.setdefault(("job", n) if job[4] is None else job[4], []).append(job)
        claims = []
        for key, own in members.items():
            cap, weight = (own[0][1], own[0][2]) if isinstance(key, tuple) else self.groups[key]
            claims.append((min(cap, sum(j[1] for j in own)), weight))
        for own, rate in zip(members.values(), split(self.capacity, claims), strict=True):
            for job, r in zip(own, split(rate, [(j[1], j[2]) for j in own]), strict=True):
                job[3] = r

    def _serve(self):
        while True:
            self._advance()
            for done in [d for d, job in self.jobs.items() if job[0] <= 1e-9]:
                del self.jobs[done]
                done.succeed()
            jobs = list(self.jobs.values())
            self._rates(jobs)
            soonest = min((j[0] / j[3] for j in jobs if j[3] > 0), default=math.inf)
            self._wake = self.env.event()
            if soonest < math.inf:
                yield self.env.timeout(soonest) | self._wake
            else:
                yield self._wake
