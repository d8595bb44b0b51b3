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
  traffic is not shaped); it is deleted with the network, and its route with it.

Latency is not emulated: this kernel's traffic control has `tbf` and `htb` but not
`netem`, so links differ in bandwidth and queueing only, with the round trip of a
bridge on one machine (tens of microseconds). What that leaves out: the round
trips of a real internet path (10 to 300 ms), which slow TCP's ramp-up, every
request-answer exchange and the relay tree's first bytes.

Cleanup is the harness's job, always: on leaving the `with` block, on an exception,
on Ctrl-C (SIGINT) and on SIGTERM, it stops the processes it started (their whole
process groups), deletes the namespaces (which removes their links) and removes the
cgroups. A run that was killed with SIGKILL leaves them behind; every name carries
the prefix `srl` and the creating process's id, and `sweep()` removes those whose
process is gone, killing what still runs in them (a new `Network` calls it first).

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

from swarmrl.procs import pid_alive

SUBNET = ipaddress.ip_network("198.18.0.0/15")
PREFIX = "srl"  # every namespace and cgroup this module makes is named PREFIX<pid>-...
CGROUP_CPU = Path("/sys/fs/cgroup/cpu")
CFS_PERIOD_US = 100_000
STOP_GRACE_S = 5.0


class NetworkUnavailable(RuntimeError):
    """Namespaces cannot be made here (not root, no iproute2, no permission)."""


@dataclass(frozen=True)
class Link:
    """A node's access link: Mbit/s each way (None: not shaped)."""

    mbit: float | None = None

    def __post_init__(self):
        if self.mbit is not None and not 0.01 <= self.mbit <= 100_000:
            raise ValueError(f"link rate {self.mbit} Mbit/s: expected 0.01 to 100000")


@dataclass
class Node:
    name: str
    namespace: str
    address: str
    link: Link
    cpu: float | None  # fraction of one core, None: not held
    cgroup: Path | None = None
    processes: list[subprocess.Popen] = field(default_factory=list)


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check)


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
    made = _ip("netns", "add", probe, check=False)
    if made.returncode != 0:
        return False, f"'ip netns add' failed: {made.stderr.strip()}"
    _ip("netns", "del", probe, check=False)
    return True, ""


def _owner(name: str) -> int | None:
    """The pid in a name made by this module (PREFIX<pid>-...), or None."""
    if not name.startswith(PREFIX):
        return None
    head = name[len(PREFIX) :].split("-", 1)[0]
    return int(head) if head.isdigit() else None
    return True


def namespaces() -> list[str]:
    """The names of the network namespaces on this machine."""
    out = _ip("netns", "list", check=False).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def sweep() -> list[str]:
    """Remove the namespaces and cgroups left by runs whose process is gone (a run
    killed with SIGKILL); returns what was removed."""
    gone = []
    for name in namespaces():
        pid = _owner(name)
        if pid is not None and not pid_alive(pid):
            left = _ip("netns", "pids", name, check=False).stdout.split()
            _kill_all(int(p) for p in left)  # processes it started, still inside
            _ip("netns", "del", name, check=False)
            gone.append(name)
    for line in _ip("-o", "link", "show", check=False).stdout.splitlines():
        name = line.split(":")[1].strip().split("@")[0]
        pid = _owner(name[:-1]) if name.endswith("h") else None
        if pid is not None and not pid_alive(pid):  # a host leg (attach_host)
            _ip("link", "del", name, check=False)
            gone.append(name)
    if CGROUP_CPU.is_dir():
        for group in CGROUP_CPU.glob(f"{PREFIX}*"):
            pid = _owner(group.name)
            if pid is not None and not pid_alive(pid):
                _kill_all(int(p) for p in _tasks(group))
                _remove_cgroup(group)
                gone.append(str(group))
    return gone


def _tasks(group: Path) -> list[str]:
    return [t for f in group.rglob("cgroup.procs") for t in f.read_text().split()]


def _kill_all(pids) -> None:
    pids = list(pids)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + STOP_GRACE_S
    while any(pid_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.02)  # a killed process leaves its namespace and cgroup as it is reaped


def _remove_cgroup(group: Path) -> None:
    for child in sorted(group.glob("*/"), reverse=True):
        if (child / "cgroup.procs").exists():
            _remove_cgroup(child)
    with contextlib.suppress(OSError):
        group.rmdir()


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
        self._closed = False
        self._leg = ""
        self._old_handlers: dict[int, object] = {}

    # lifetime

    def __enter__(self) -> Network:
        sweep()
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(ValueError):  # not the main thread: the caller's job
                self._old_handlers[sig] = signal.signal(sig, self._on_signal)
        try:
            _ip("netns", "add", self.router)
            _ip("-n", self.router, "link", "add", "br0", "type", "bridge")
            _ip("-n", self.router, "link", "set", "br0", "up")
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
                _stop(p)
        for node in self.nodes.values():  # what others started there (a supervisor's)
            _kill_all(
                int(p) for p in _ip("netns", "pids", node.namespace, check=False).stdout.split()
            )
            _ip("netns", "del", node.namespace, check=False)
        if self._leg:  # a namespace is destroyed later, by the kernel: its links too
            _ip("link", "del", self._leg, check=False)
        _ip("netns", "del", self.router, check=False)
        if self.cgroup is not None:
            _remove_cgroup(self.cgroup)
        for sig, old in self._old_handlers.items():
            with contextlib.suppress(ValueError, TypeError):
                signal.signal(sig, old)

    # nodes

    def add(
        self, name: str, link: Link = Link(), cpu: float | None = None, weight: int | None = None
    ) -> Node:
        """A node in its own namespace, on `link`, held to `cpu` of one core if given;
        `weight`: its claim on the CPU when the machine is busy (cgroup v1 `cpu.shares`,
        1024 is a plain process's), so that a node that has a machine of its own in a
        real swarm (the orchestrator) is not starved by dozens of emulated workers.
        The nodes' groups share one parent, which competes with the machine's other
        processes as one process would: give every node of a run a weight or a share
        so that all of them compete inside it, by their weights."""
        if name in self.nodes:
            raise ValueError(f"node '{name}' exists")
        if cpu is not None and not 0.01 <= cpu <= os.cpu_count():
            raise ValueError(f"cpu share {cpu}: expected 0.01 to {os.cpu_count()} cores")
        if weight is not None and not 2 <= weight <= 262144:
            raise ValueError(f"cpu weight {weight}: expected 2 to 262144 (cpu.shares)")
        index = len(self.nodes)
        node = Node(name, f"{self.tag}-n{index}", str(next(self._hosts)), link, cpu)
        self.nodes[name] = node
        peer = f"v{index}"
        _ip("netns", "add", node.namespace)
        _ip("link", "add", "eth0", "netns", node.namespace, "type", "veth",
            "peer", "name", peer, "netns", self.router)  # fmt: skip
        _ip("-n", self.router, "link", "set", peer, "master", "br0")
        _ip("-n", self.router, "link", "set", peer, "up")
        _ip(
            "-n", node.namespace, "addr", "add", f"{node.address}/{SUBNET.prefixlen}", "dev", "eth0"
        )
        _ip("-n", node.namespace, "link", "set", "eth0", "up")
        _ip("-n", node.namespace, "link", "set", "lo", "up")
        if link.mbit is not None:
            _shape(node.namespace, "eth0", link.mbit)  # what the node sends
            _shape(self.router, peer, link.mbit)  # what it receives
        if cpu is not None or weight is not None:
            node.cgroup = self._node_cgroup(node, cpu, weight)
        return node

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
        _ip("link", "add", leg, "type", "veth", "peer", "name", "host", "netns", self.router)
        _ip("-n", self.router, "link", "set", "host", "master", "br0")
        _ip("-n", self.router, "link", "set", "host", "up")
        _ip("addr", "add", f"{address}/{SUBNET.prefixlen}", "dev", leg)
        _ip("link", "set", leg, "up")
        return address

    def shaping(self, node: Node) -> dict[str, float | None]:
        """The rates in force on `node`'s link, read back from the kernel, Mbit/s."""
        index = list(self.nodes).index(node.name)
        return {
            "up": _rate(node.namespace, "eth0"),
            "down": _rate(self.router, f"v{index}"),
        }


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


def _stop(p: subprocess.Popen) -> None:
    """SIGTERM to the process's group, SIGKILL after STOP_GRACE_S; the group is killed
    even when its first process has ended, so that none of its children stays."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(p.pid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        p.wait(STOP_GRACE_S)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(p.pid, signal.SIGKILL)
    p.wait()
