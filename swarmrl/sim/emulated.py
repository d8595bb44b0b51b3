"""A whole swarm on an emulated network: `swarmrl rl`'s processes, each node in a
namespace of its own (sim/netns.py), relays in a tree.

`Emulated` is a launcher `Placement` (launch/swarm.py): every process gets its own
node on the network, named as the launcher names it (orchestrator, trainer,
relay-0, validator-0, worker-3, cheater-0), with the link and CPU share its
`Layout` gives it, an address from 198.18.0.0/15 and port 8000 (each node has all
its ports to itself). The relays form a tree of `Layout.levels` levels: the first
`Layout.fanout` relays mirror the origin (the trainer), each later level mirrors
the whole level above it, and workers and validators fetch from the last level
(the inner levels' relays do not register with the orchestrator, which would
otherwise send workers to them too).
The launcher itself stays in the host's namespace, joined to the bridge
(`Network.attach_host`) to watch the run.

What is emulated and what is not: see sim/netns.py (bandwidth, round trips, jitter,
loss, CPU and address ranges). Every process still reads and writes the same disk
(the run directory).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from swarmrl.config import RunConfig
from swarmrl.launch.supervisor import Proc
from swarmrl.sim.netns import SUBNET, Link, Network, Node

PORT = 8000


@dataclass
class Layout:
    """Links and CPU shares by process name or role, and the relay tree's shape."""

    links: dict[str, float] = field(default_factory=dict)  # name or role -> Mbit/s
    cpus: dict[str, float] = field(default_factory=dict)  # name or role -> cores
    weights: dict[str, float] = field(default_factory=dict)  # name or role -> cpu.shares
    fanout: int = 1  # relays on the first level
    levels: int = 1
    # name or role -> (round trip ms, jitter ms, loss each way): netns.Link's
    paths: dict[str, tuple[float, float, float]] = field(default_factory=dict)
    blocks: dict[str, int] = field(default_factory=dict)  # name or role -> its /24 (netns)

    def of(self, table: dict, name: str):
        role = name.split("-")[0]
        return table.get(name, table.get(role))

    def link(self, name: str) -> Link:
        rtt, jitter, loss = self.of(self.paths, name) or (0.0, 0.0, 0.0)
        return Link(self.of(self.links, name), rtt, jitter, loss)

    def level(self, index: int) -> int:
        """The level (0: fed by the origin) of relay `index`."""
        return min(index // max(1, self.fanout), self.levels - 1)


class Emulated:
    """A `Placement` on `net` (see the module's docstring)."""

    def __init__(self, net: Network, layout: Layout | None = None):
        self.net = net
        self.layout = layout or Layout()

    def node(self, name: str) -> Node:
        if name not in self.net.nodes:
            weight = self.layout.of(self.layout.weights, name)
            self.net.add(
                name,
                self.layout.link(name),
                self.layout.of(self.layout.cpus, name),
                None if weight is None else int(weight),
                self.layout.of(self.layout.blocks, name),
            )
        return self.net.nodes[name]

    def host(self, name: str, default: str) -> str:
        return self.node(name).address

    def port(self, name: str, host: str) -> int:
        return PORT

    def upstream(self, index: int, origin: str, relays: list[str]) -> list[str]:
        level = self.layout.level(index)
        above = [u for i, u in enumerate(relays) if self.layout.level(i) == level - 1]
        return above if level > 0 and above else [origin]

    def servers(self, origin: str, relays: list[str]) -> list[str]:
        if not relays:
            return [origin]
        last = max(self.layout.level(i) for i in range(len(relays)))
        return [u for i, u in enumerate(relays) if self.layout.level(i) == last]

    def inner(self, index: int, count: int) -> bool:
        return self.layout.level(index) < self.layout.level(count - 1)

    def relay_networks(self, cfg: RunConfig) -> list[str]:
        return [str(SUBNET)]

    def wrap(self, proc: Proc) -> None:
        node = self.node(proc.name)
        proc.argv = self.net.command(node, proc.argv)
        if proc.restart_argv is not None:
            proc.restart_argv = self.net.command(node, proc.restart_argv)
