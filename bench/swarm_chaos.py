"""The emulated swarm's events (bench/swarm_scale.py's docstring lists them), each at
a step of the trainer, never at a time, and what is sampled meanwhile: nodes up, CPU
seconds per process, the orchestrator's /metrics once a step, the keys it trusts."""

from __future__ import annotations

import argparse
import json
import math
import threading
import time
from pathlib import Path

import swarm_records as records

from swarmrl.sim import netns

PARTITION_STEP = 8
HOSTILE_STEP = 12


class Chaos(threading.Thread):
    """The run's events, each at its step (see the module's docstring)."""

    def __init__(self, net: netns.Network, run: Path, a: argparse.Namespace, url: list[str]):
        super().__init__(daemon=True)
        self.net, self.run_dir, self.a, self.url = net, run, a, url
        self.flag = run.parent / "late-workers.go"
        self.late = {f"worker-{i}" for i in range(a.workers - a.late, a.workers)}
        self.events: list[dict] = []
        self.scrapes: list[dict] = []  # /metrics, once a step
        self.up: list[tuple[float, int, int]] = []  # (time, worker nodes up, others up)
        self.cpu: dict[tuple[str, int], float] = {}  # (node, pid) -> CPU seconds, last seen
        self.cpu_series: list[dict] = []  # every 2 s: time, step, node -> CPU s so far
        self.stop = threading.Event()
        self.trusted: set[str] = set()  # keys in the orchestrator's trusted_workers, as run
        # the last relay (a leaf: workers fetch from it) turns hostile at HOSTILE_STEP
        self.hostile_name = f"relay-{a.relays - 1}" if a.hostile and a.relays > 1 else None
        self.hostile_flag = run.parent / "hostile-relay.go"

    def step(self) -> int:
        p = self.run_dir / "metrics.jsonl"
        return len(p.read_text().splitlines()) if p.exists() else 0

    def published(self) -> int:
        p = self.run_dir / "published.jsonl"
        return len(p.read_text().splitlines()) if p.exists() else 0

    def kill(self, name: str, why: str) -> None:
        node = self.net.nodes[name]
        pids = netns.ip("netns", "pids", node.namespace, check=False).stdout.split()
        netns.kill_all(int(p) for p in pids)
        self.events.append({"step": self.step(), "kill": name, "processes": len(pids), "why": why,
                            "time": time.time()})  # fmt: skip

    def run(self) -> None:
        a = self.a
        done: set[str] = set()
        workers = [f"worker-{i}" for i in range(a.workers - a.late)]
        churn = workers[: max(1, math.ceil(a.churn * a.workers))]  # at least that share
        # a quarter of the workers, of every link class, none of them churned
        spared = [f"worker-{i}" for i in range(a.workers) if f"worker-{i}" not in churn]
        cut = spared[::3][: math.ceil(a.workers / 4)]
        seen, counted = -1, 0.0
        while not self.stop.wait(0.2):
            if time.time() - counted >= 2.0:
                counted = time.time()
                self.count_up(counted)
            step = self.step()
            if step != seen:
                seen = step
                self.scrape()
            if step >= 2 and "late" not in done:
                self.flag.touch()
                self.events.append({"step": step, "join": a.late, "time": time.time()})
                done.add("late")
            if step >= 3 and "churn" not in done:
                for name in churn:
                    self.kill(name, "churn")
                done.add("churn")
            if step >= 4 and "relay" not in done:
                if "relay_at" not in done:
                    base = self.published()
                    done.add("relay_at")
                if self.published() > base:  # a version was just published
                    self.kill("relay-0", "during a broadcast")
                    done.add("relay")
            if step >= 5 and "validator" not in done and a.validators:
                self.kill("validator-0", "validator")
                done.add("validator")
            if step >= 6 and "orchestrator" not in done:
                self.scrape()
                self.kill("orchestrator", "orchestrator SIGKILL")
                done.add("orchestrator")
            if step >= HOSTILE_STEP and "hostile" not in done and self.hostile_name:
                self.hostile_flag.touch()
                self.kill(self.hostile_name, "turns hostile")  # restarted as the liar
                done.add("hostile")
            if step >= PARTITION_STEP and "partition" not in done and a.partition > 0:
                self.net.cut(cut)
                cut_at = time.time()
                self.events.append({"step": step, "cut": cut, "time": cut_at})
                done.add("partition")
            if "partition" in done and "healed" not in done and time.time() - cut_at >= a.partition:
                self.net.heal(cut)
                self.events.append({"step": step, "healed": len(cut), "time": time.time()})
                done.add("healed")

    def count_up(self, now: float) -> None:
        """Nodes with a process running in their namespace (the timeline's nodes up)."""
        workers = others = 0
        joined = self.flag.exists()
        for name, node in list(self.net.nodes.items()):
            pids = netns.ip("netns", "pids", node.namespace, check=False).stdout.split()
            for pid in pids:
                self.cpu[(name, int(pid))] = records.cpu_s(int(pid)) or self.cpu.get(
                    (name, int(pid)), 0
                )
            if name in self.late and not joined:
                continue  # a late worker's shell, waiting for its flag
            if pids and name.startswith(("worker-", "cheater-")):
                workers += 1
            elif pids:
                others += 1
        self.up.append((now, workers, others))
        by_node: dict[str, float] = {}
        for (name, _), used in self.cpu.items():
            by_node[name] = round(by_node.get(name, 0.0) + used, 2)
        self.cpu_series.append({"time": now, "step": self.step(), "cpu_s": by_node})

    def read_trusted(self) -> None:
        """The keys the running orchestrator was told to trust (its command line)."""
        node = self.net.nodes.get("orchestrator")
        pids = netns.ip("netns", "pids", node.namespace, check=False).stdout.split() if node else []
        for pid in pids:
            try:
                argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
            except OSError:
                continue
            for arg in argv:
                if arg.startswith("orchestrator.trusted_workers="):
                    self.trusted |= set(json.loads(arg.split("=", 1)[1]))

    def scrape(self) -> None:
        import httpx

        self.read_trusted()

        try:
            text = httpx.get(self.url[0] + "/metrics", timeout=5).text
        except httpx.HTTPError:
            return
        self.scrapes.append({"step": self.step(), "text": text})
