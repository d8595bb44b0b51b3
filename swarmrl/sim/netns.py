"""An emulated network on one machine: each node in a Linux network namespace of its
own, on a shaped link to one bridge, and, if asked, held to a share of a CPU.

What it builds (`Network`, a context manager):

- a router namespace holding a bridge (`br0`); it has no uplink, so nothing inside
  can reach anything outside;
- per node, a namespace holding `eth0` with an address from 198.18.0.0/15 (the
  range reserved for benchmarks, RFC 2544), joined to the bridge by a veth pair
  created directly inside the two namespaces (no name in the host's namespace);
- per node, a token bucket (`tbf`) on each end of its link: its upload on `eth0`,
  its download on the router's end, at the node's Mbit/s;
- per node with a CPU share, a cgroup (v1 `cpu` controller) whose CFS quota holds
  it to that fraction of one core, and, with a weight, whose `cpu.shares` sets its
  claim on a busy machine; its processes are placed there before they run;
- if asked (`attach_host`), a leg from the host's own namespace to the bridge, with
  the subnet's last address, so that a launcher outside can watch the nodes (its
  traffic is not shaped); it is deleted with the network, and its route with it;
- per node, if asked (`add(..., block=K)`), an address from /24 number K of the
  subnet, so that nodes can share an address range or not, as on the internet (the
  orchestrator's per-range shares, orchestrator/ranges.py, see them as parties);
- per node with a round trip, jitter or loss on its link (`Link.rtt_ms`,
  `jitter_ms`, `loss`): loss by iptables' `statistic` match in the router, each way
  of the link, in the kernel; delay and jitter by the delay line
  (sim/delayline.py), one process in the router's namespace that holds every
  bridged packet in a netfilter queue until its time. This kernel's traffic control
  has `tbf` and `htb` but neither `netem` nor `fq`, so delay has to come from user
  space. Once one link is impaired, every node sends one segment per packet (no
  segmentation offload), so that loss and delay act on the packets a real link
  carries. A packet crosses its sender's `tbf`, then the loss rules and the delay
  line, then its receiver's `tbf`.

What the emulation still leaves out: the round trip is the sum of two access links'
(no path through a core with its own congestion and routes), the loss is random and
independent (no bursts, no loss from a full queue but `tbf`'s own), jitter never
reorders a pair's packets, and every packet crosses the one delay line on a shared
CPU (its own delay under load shows in the stats it leaves).

Cleanup is the harness's job, always: on leaving the `with` block, on an exception,
on Ctrl-C (SIGINT) and on SIGTERM, it stops the processes it started (their whole
process groups), deletes the namespaces (which removes their links) and removes the
cgroups. A run that was killed with SIGKILL leaves them behind; every name carries
the prefix `srl` and the creating process's id, and `sweep()` removes those whose
process is gone, killing what still runs in them (a new `Network` calls it first;
sim/teardown.py holds the stopping, removing and sweeping).

The tools: iproute2's `ip` and `tc` (Debian's iproute2), run as root. Where a
namespace cannot be made, `available()` says why, and `Network` raises
`NetworkUnavailable` with that reason: there is no fallback to loopback.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from swarmrl.sim.teardown import (  # noqa: F401  (PREFIX, CGROUP_CPU, sweep: the module's API)
    CGROUP_CPU,
    PREFIX,
    ip,
    kill_all,
    namespaces,
    owner,
    remove_cgroup,
    stop,
    sweep,
)

SUBNET = ipaddress.ip_network("198.18.0.0/15")
CFS_PERIOD_US = 100_000
DELAYLINE_START_S = 60.0  # from its start to its queue bound ("ready")
DELAYLINE_WEIGHT = 32768  # cpu.shares of the delay line: every delayed packet waits on it


class NetworkUnavailable(RuntimeError):
    """Namespaces cannot be made here (not root, no iproute2, no permission)."""


@dataclass(frozen=True)
class Link:
    """A node's access link: Mbit/s each way (None: not shaped); its round trip to the
    core of the internet and that round trip's jitter, in ms (the round trip between
    two nodes is the sum of their links'); the share of packets it loses each way."""

    mbit: float | None = None
    rtt_ms: float = 0.0
    jitter_ms: float = 0.0
    loss: float = 0.0

    def __post_init__(self):
        if self.mbit is not None and not 0.01 <= self.mbit <= 100_000:
            raise ValueError(f"link rate {self.mbit} Mbit/s: expected 0.01 to 100000")
        if not 0.0 <= self.rtt_ms <= 5000.0:
            raise ValueError(f"round trip {self.rtt_ms} ms: expected 0 to 5000")
        if not 0.0 <= self.jitter_ms <= 1000.0:
            raise ValueError(f"jitter {self.jitter_ms} ms: expected 0 to 1000")
        if not 0.0 <= self.loss <= 0.5:
            raise ValueError(f"loss {self.loss}: expected a share from 0 to 0.5")

    @property
    def delayed(self) -> bool:
        return bool(self.rtt_ms or self.jitter_ms)


@dataclass
class Node:
    name: str
    namespace: str
    address: str
    link: Link
    cpu: float | None  # fraction of one core, None: not held
    cgroup: Path | None = None
    processes: list[subprocess.Popen] = field(default_factory=list)


def _tc(*args: str) -> None:
    subprocess.run(["tc", *args], capture_output=True, text=True, check=True)


def available() -> tuple[bool, str]:
    """Whether network namespaces can be made here, and if not, why."""
    if os.name != "posix" or not Path("/proc/self/ns/net").exists():
        return False, "network namespaces need Linux"
    if os.geteuid() != 0:
        return False, "network namespaces need root (run as root, or in a VM or container as root)"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return False, f"'{tool}' not found: install iproute2 (apt-get install iproute2)"
    probe = f"{PREFIX}{os.getpid()}-probe"
    made = ip("netns", "add", probe, check=False)
    if made.returncode != 0:
        return False, f"'ip netns add' failed: {made.stderr.strip()}"
    ip("netns", "del", probe, check=False)
    return True, ""


class Network:
    """Nodes on shaped links to one bridge; see the module's docstring.

    net = Network()
    with net:
        a = net.add("orchestrator", Link(100))
        b = net.add("worker-0", Link(10), cpu=0.25)
        net.start(a, ["python", "-m", "http.server", "--bind", a.address, "8000"])
    """

    def __init__(self, tag: str = ""):
        ok, why = available()
        if not ok:
            raise NetworkUnavailable(why)
        self.tag = f"{PREFIX}{os.getpid()}-{tag or hex(time.monotonic_ns())[-6:]}"
        self.router = f"{self.tag}-r"
        self.nodes: dict[str, Node] = {}
        self.cgroup: Path | None = None
        self._hosts = SUBNET.hosts()
        self._taken: set[str] = set()
        self._closed = False
        self._delayline = None  # sim/delayline.py's DelayLineProcess, once a link is delayed
        self._filtering = False
        self._stats: dict | None = None
        self._leg = ""
        self._old_handlers: dict[int, object] = {}

    # lifetime

    def __enter__(self) -> Network:
        sweep()
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(ValueError):  # not the main thread: the caller's job
                self._old_handlers[sig] = signal.signal(sig, self._on_signal)
        try:
            ip("netns", "add", self.router)
            ip("-n", self.router, "link", "add", "br0", "type", "bridge")
            ip("-n", self.router, "link", "set", "br0", "up")
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _on_signal(self, signum, frame) -> None:
        self.close()
        old = self._old_handlers.get(signum)
        if callable(old):
            old(signum, frame)
        elif signum == signal.SIGINT:
            raise KeyboardInterrupt
        else:
            raise SystemExit(128 + signum)

    def close(self) -> None:
        """Stop every process, delete every namespace and cgroup (idempotent)."""
        if self._closed:
            return
        self._closed = True
        for node in self.nodes.values():
            for p in node.processes:
                stop(p)
        for node in self.nodes.values():  # what others started there (a supervisor's)
            kill_all(
                int(p) for p in ip("netns", "pids", node.namespace, check=False).stdout.split()
            )
            ip("netns", "del", node.namespace, check=False)
        if self._delayline is not None:
            self._stats = self._delayline.stop(stop)
        if self._leg:  # a namespace is destroyed later, by the kernel: its links too
            ip("link", "del", self._leg, check=False)
        ip("netns", "del", self.router, check=False)
        if self.cgroup is not None:
            remove_cgroup(self.cgroup)
        for sig, old in self._old_handlers.items():
            with contextlib.suppress(ValueError, TypeError):
                signal.signal(sig, old)

    # nodes

    def add(
        self,
        name: str,
        link: Link = Link(),
        cpu: float | None = None,
        weight: int | None = None,
        block: int | None = None,
    ) -> Node:
        """A node in its own namespace, on `link`, held to `cpu` of one core if given;
        `weight`: its claim on the CPU when the machine is busy (cgroup v1 `cpu.shares`,
        1024 is a plain process's), so that a node that has a machine of its own in a
        real swarm (the orchestrator) is not starved by dozens of emulated workers.
        The nodes' groups share one parent, which competes with the machine's other
        processes as one process would: give every node of a run a weight or a share
        so that all of them compete inside it, by their weights. `block`: the /24 of
        the subnet (0 to 511) the node's address comes from, as nodes of one provider
        or household share a range on the internet; by default the next free address.
        A link with a round trip, jitter or loss is impaired as the module says."""
        if name in self.nodes:
            raise ValueError(f"node '{name}' exists")
        if cpu is not None and not 0.01 <= cpu <= os.cpu_count():
            raise ValueError(f"cpu share {cpu}: expected 0.01 to {os.cpu_count()} cores")
        if weight is not None and not 2 <= weight <= 262144:
            raise ValueError(f"cpu weight {weight}: expected 2 to 262144 (cpu.shares)")
        index = len(self.nodes)
        node = Node(name, f"{self.tag}-n{index}", self._address(block), link, cpu)
        self.nodes[name] = node
        peer = f"v{index}"
        ip("netns", "add", node.namespace)
        ip("link", "add", "eth0", "netns", node.namespace, "type", "veth",
            "peer", "name", peer, "netns", self.router)  # fmt: skip
        ip("-n", self.router, "link", "set", peer, "master", "br0")
        ip("-n", self.router, "link", "set", peer, "up")
        ip("-n", node.namespace, "addr", "add", f"{node.address}/{SUBNET.prefixlen}", "dev", "eth0")
        ip("-n", node.namespace, "link", "set", "eth0", "up")
        ip("-n", node.namespace, "link", "set", "lo", "up")
        if link.mbit is not None:
            _shape(node.namespace, "eth0", link.mbit)  # what the node sends
            _shape(self.router, peer, link.mbit)  # what it receives
        if cpu is not None or weight is not None:
            node.cgroup = self._node_cgroup(node, cpu, weight)
        if link.delayed or link.loss:
            self._impair(node, peer)
        if self._filtering:
            _one_segment(node)
        return node

    def _address(self, block: int | None) -> str:
        """The next free address, in /24 number `block` of the subnet if given."""
        if block is None:
            address = str(next(a for a in self._hosts if str(a) not in self._taken))
        else:
            blocks = SUBNET.num_addresses // 256
            if not 0 <= block < blocks:
                raise ValueError(f"address block {block}: expected 0 to {blocks - 1}")
            base = SUBNET.network_address + 256 * block
            free = [base + i for i in range(1, 254) if str(base + i) not in self._taken]
            if not free:
                raise ValueError(f"address block {block} is full")
            address = str(free[0])
        self._taken.add(address)
        return address

    def _impair(self, node: Node, port: str) -> None:
        """Loss on `node`'s link by iptables in the router (its `statistic` match, each
        way), delay and jitter by the delay line (sim/delayline.py), both on what the
        bridge forwards."""
        self._filter()
        if node.link.loss:
            for way in ("--physdev-in", "--physdev-out"):  # its upload, its download
                _iptables(self.router, "-I", "FORWARD", "1", "-m", "physdev", way, port,
                          "-m", "statistic", "--mode", "random",
                          "--probability", f"{node.link.loss:.6f}", "-j", "DROP")  # fmt: skip
        if node.link.delayed:
            self._start_delayline()
            self._delayline.set(node.address, node.link.rtt_ms, node.link.jitter_ms)

    def cut(self, names: list[str]) -> None:
        """A partition: nothing `names` send or are sent crosses the bridge until
        `heal(names)`; their processes run on, their connections time out."""
        self._filter()
        for name in names:
            port = f"v{list(self.nodes).index(name)}"
            for way in ("--physdev-in", "--physdev-out"):
                _iptables(self.router, "-I", "FORWARD", "1", "-m", "physdev", way, port,
                          "-j", "DROP")  # fmt: skip

    def heal(self, names: list[str]) -> None:
        for name in names:
            port = f"v{list(self.nodes).index(name)}"
            for way in ("--physdev-in", "--physdev-out"):
                _iptables(self.router, "-D", "FORWARD", "-m", "physdev", way, port, "-j", "DROP")

    def _filter(self) -> None:
        """The bridge hands what it forwards to iptables (once): loss, cuts, delay."""
        if self._filtering:
            return
        if shutil.which("iptables") is None:
            raise NetworkUnavailable("impaired links need iptables (apt-get install iptables)")
        made = self.run_router(["sysctl", "-qw", "net.bridge.bridge-nf-call-iptables=1"])
        if made.returncode != 0:
            raise NetworkUnavailable(
                f"the bridge cannot hand packets to iptables (br_netfilter): {made.stderr.strip()}"
            )
        self._filtering = True
        for node in self.nodes.values():
            _one_segment(node)

    def _start_delayline(self) -> None:
        import importlib.util

        from swarmrl.sim.delayline import DelayLineProcess

        if self._delayline is not None:
            return
        if importlib.util.find_spec("netfilterqueue") is None:
            raise NetworkUnavailable(
                "delayed links need NetfilterQueue (make netqueue: libnetfilter-queue-dev, "
                "then pip install netfilterqueue)"
            )
        group = None
        if CGROUP_CPU.is_dir():  # it carries every packet: it comes first for the CPU
            if self.cgroup is None:
                self.cgroup = CGROUP_CPU / self.tag
                self.cgroup.mkdir()
            (self.cgroup / "delayline").mkdir()
            (self.cgroup / "delayline" / "cpu.shares").write_text(str(DELAYLINE_WEIGHT))
            group = self.cgroup / "delayline" / "cgroup.procs"
        try:
            self._delayline = DelayLineProcess(self.router, self.tag, group, DELAYLINE_START_S)
        except RuntimeError as e:
            raise NetworkUnavailable(str(e)) from None
        # every bridged packet goes through it; no bypass: without it nothing crosses
        _iptables(self.router, "-A", "FORWARD", "-m", "physdev", "--physdev-is-bridged",
                  "-j", "NFQUEUE", "--queue-num", "0")  # fmt: skip

    def run_router(self, argv: list[str], **kw) -> subprocess.CompletedProcess:
        return subprocess.run(["ip", "netns", "exec", self.router, *argv],
                              capture_output=True, text=True, **kw)  # fmt: skip

    def delay_stats(self) -> dict | None:
        """What the delay line saw (packets, a sample of delays) and the CPU seconds it
        used, once the network is closed; None where no link was delayed."""
        return self._stats

    def impairment(self, node: Node) -> dict[str, float]:
        """The round trip, jitter and loss set on `node`'s link, read back from the
        delay line's table and the router's iptables rules."""
        index = list(self.nodes).index(node.name)
        rules = self.run_router(["iptables", "-w", "-S", "FORWARD"]).stdout.splitlines()
        loss = {}
        for rule in rules:
            words = rule.split()  # a loss rule (a cut has no --probability)
            if "--probability" in words and f"v{index}" in words:
                way = words[words.index(f"v{index}") - 1]
                loss[way] = float(words[words.index("--probability") + 1])
        links = self._delayline.links if self._delayline else {}
        rtt, jitter = links.get(node.address, [0.0, 0.0])
        return {"rtt_ms": rtt, "jitter_ms": jitter,
                "loss_up": loss.get("--physdev-in", 0.0),
                "loss_down": loss.get("--physdev-out", 0.0)}  # fmt: skip

    def _node_cgroup(self, node: Node, cpu: float | None, weight: int | None) -> Path:
        if not (CGROUP_CPU / "cpu.cfs_quota_us").exists():
            raise NetworkUnavailable(
                f"no cgroup v1 cpu controller at {CGROUP_CPU}: node speeds cannot be held"
            )
        if self.cgroup is None:
            self.cgroup = CGROUP_CPU / self.tag
            self.cgroup.mkdir()
        group = self.cgroup / node.name
        group.mkdir()
        if cpu is not None:
            (group / "cpu.cfs_period_us").write_text(str(CFS_PERIOD_US))
            (group / "cpu.cfs_quota_us").write_text(str(int(cpu * CFS_PERIOD_US)))
        if weight is not None:
            (group / "cpu.shares").write_text(str(weight))
        return group

    def command(self, node: Node, argv: list[str]) -> list[str]:
        """`argv` as a command that runs inside `node`'s namespace, and in its cgroup
        from before it starts."""
        command = ["ip", "netns", "exec", node.namespace, *argv]
        if node.cgroup is not None:
            # the shell joins the cgroup, then becomes the command: nothing runs outside
            command = ["sh", "-c", 'echo $$ > "$0" && exec "$@"',
                       str(node.cgroup / "cgroup.procs"), *command]  # fmt: skip
        return command

    def start(self, node: Node, argv: list[str], **popen) -> subprocess.Popen:
        """`argv` inside `node` (`command`), in a process group of its own; stopped
        when the network closes."""
        p = subprocess.Popen(self.command(node, argv), start_new_session=True, **popen)
        node.processes.append(p)
        return p

    def run(self, node: Node, argv: list[str], timeout: float = 60.0, **kw):
        """`argv` in `node`'s namespace to completion (subprocess.run's answer)."""
        command = ["ip", "netns", "exec", node.namespace, *argv]
        return subprocess.run(command, timeout=timeout, **kw)

    def attach_host(self) -> str:
        """Join the host's namespace to the bridge (see the module's docstring); returns
        the host's address there. One network per process may do this."""
        address = str(SUBNET.broadcast_address - 1)
        leg = self._leg = f"{self.tag.split('-')[0]}h"  # PREFIX<pid>h: at most 15 characters
        ip("link", "add", leg, "type", "veth", "peer", "name", "host", "netns", self.router)
        ip("-n", self.router, "link", "set", "host", "master", "br0")
        ip("-n", self.router, "link", "set", "host", "up")
        ip("addr", "add", f"{address}/{SUBNET.prefixlen}", "dev", leg)
        ip("link", "set", leg, "up")
        return address

    def shaping(self, node: Node) -> dict[str, float | None]:
        """The rates in force on `node`'s link, read back from the kernel, Mbit/s."""
        index = list(self.nodes).index(node.name)
        return {
            "up": _rate(node.namespace, "eth0"),
            "down": _rate(self.router, f"v{index}"),
        }


def _one_segment(node: Node) -> None:
    """What `node` sends leaves as packets of one segment each (no TCP segmentation
    offload): loss and delay then act on the packets a real link carries, not on
    64 kB batches of them."""
    ip("-n", node.namespace, "link", "set", "dev", "eth0", "gso_max_segs", "1")


def _iptables(namespace: str, *args: str) -> None:
    subprocess.run(["ip", "netns", "exec", namespace, "iptables", "-w", *args],
                   capture_output=True, text=True, check=True)  # fmt: skip


def _shape(namespace: str, dev: str, mbit: float) -> None:
    rate = int(mbit * 1_000_000)  # bits/s
    # a bucket of at least one timer tick's worth (HZ >= 100) and a few full frames
    burst = max(rate // 8 // 100, 4 * 1514)
    _tc("-n", namespace, "qdisc", "replace", "dev", dev, "root", "tbf",
        "rate", f"{rate}bit", "burst", str(burst), "latency", "50ms")  # fmt: skip


def _rate(namespace: str, dev: str) -> float | None:
    out = subprocess.run(["tc", "-n", namespace, "-j", "qdisc", "show", "dev", dev],
                         capture_output=True, text=True, check=True).stdout  # fmt: skip
    for q in json.loads(out or "[]"):
        if q.get("kind") == "tbf":
            return q["options"]["rate"] * 8 / 1_000_000  # bytes/s -> Mbit/s
    return None
