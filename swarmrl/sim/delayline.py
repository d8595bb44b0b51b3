"""Latency and jitter for the emulated network, in user space: the packets that cross
the bridge are held in a netfilter queue and let go when their time has come.

This kernel has no `netem` (nor `fq`, so no pacing by departure time), so delay
cannot come from traffic control. What is used instead, all maintained:

- the bridge hands its frames to iptables (`br_netfilter`, `bridge-nf-call-iptables`
  in the router's namespace only);
- iptables sends every bridged IPv4 packet to an NFQUEUE (the kernel's
  `nfnetlink_queue`), with no bypass: when this process is not there, nothing
  crosses, so a run cannot quietly measure an undelayed network;
- this process reads the queue through NetfilterQueue (the maintained Python binding
  of libnetfilter_queue), copying only each packet's first 20 bytes (its IPv4
  header: the two addresses), and gives each packet its verdict (accept) once its
  delay has passed. The packet itself stays in the kernel meanwhile.

Loss is not done here: iptables' `statistic` match drops packets in the kernel, per
link and direction (sim/netns.py sets those rules).

The delay of a packet from node A to node B is half of A's round trip plus half of
B's (each `Link.rtt_ms` is that link's round trip to the core of the internet, so
the round trip between two nodes is the sum of theirs), plus each link's jitter: a
normal draw of standard deviation `jitter_ms / 2` per link, clipped so the delay is
never negative. A packet never overtakes an earlier one of the same pair of
addresses (a real path reorders rarely; TCP reads reordering as loss), so jitter
shows as a spread of round trips, not as reordering. Addresses not in the table (the
launcher's own leg) cross without delay.

One process serves the whole network, single-threaded: a heap of held packets and a
select on the queue's socket. Its cost is about a packet's Python callback
(microseconds); `--stats` writes what it saw (packets, delays) for the harness.

    python -m swarmrl.sim.delayline --table links.json [--queue 0] [--seed 0]

`links.json`: {"198.18.0.1": [rtt_ms, jitter_ms], ...}, read again on SIGHUP. It
prints `ready` once the queue is bound and runs until SIGTERM or SIGINT.
"""

from __future__ import annotations

import argparse
import contextlib
import heapq
import ipaddress
import json
import os
import random
import selectors
import shutil
import signal
import sys
import time
from pathlib import Path

HEADER = 20  # bytes of each packet copied to this process: the IPv4 header
QUEUE_MAX = 200_000  # packets held at once (kernel side); past it the kernel drops


class DelayLine:
    """Per-packet delays by address pair (see the module's docstring)."""

    def __init__(self, links: dict[str, tuple[float, float]], seed: int = 0):
        self.load(links)
        self.random = random.Random(seed)
        self.last: dict[bytes, float] = {}  # (src, dst) -> latest release time given
        self.held: list[tuple[float, int, object]] = []
        self.count = 0
        self.delays_ms: list[float] = []  # a sample, for the stats

    def load(self, links: dict[str, tuple[float, float]]) -> None:
        self.links = {ipaddress.IPv4Address(a).packed: (r / 2000.0, j / 2000.0)
                      for a, (r, j) in links.items()}  # fmt: skip

    def delay_s(self, src: bytes, dst: bytes) -> float:
        total = 0.0
        for end in (src, dst):
            half, sd = self.links.get(end, (0.0, 0.0))
            if half or sd:
                total += max(0.0, half + (self.random.gauss(0.0, sd) if sd else 0.0))
        return total

    def take(self, packet, now: float) -> None:
        header = packet.get_payload()[:HEADER]
        src, dst = header[12:16], header[16:20]
        pair = src + dst
        release = max(now + self.delay_s(src, dst), self.last.get(pair, 0.0))
        self.last[pair] = release
        self.count += 1
        if self.count % 64 == 1:
            self.delays_ms.append(round((release - now) * 1000.0, 2))
        if release <= now:
            packet.accept()
            return
        heapq.heappush(self.held, (release, self.count, packet))

    def release(self, now: float) -> float | None:
        """Let go of every packet whose time has come; seconds to the next, or None."""
        held = self.held
        while held and held[0][0] <= now:
            heapq.heappop(held)[2].accept()
        return held[0][0] - now if held else None


class DelayLineProcess:
    """The delay line run as a process in namespace `router` (what sim/netns.py starts):
    its table and stats in a scratch directory named after `tag`, in cgroup `group`
    (its `cgroup.procs`) if given. `set` adds a link to the table; `stop(stopper)`
    ends it and returns what it saw, with the CPU seconds it used."""

    def __init__(self, router: str, tag: str, group: Path | None, start_s: float = 60.0):
        import select
        import subprocess
        import tempfile

        self.scratch = Path(tempfile.mkdtemp(prefix=f"{tag}-"))
        self.table = self.scratch / "delays.json"
        self.links: dict[str, list[float]] = {}
        self.table.write_text("{}")
        argv = [sys.executable, "-m", "swarmrl.sim.delayline", "--queue", "0",
                "--table", str(self.table), "--stats", str(self.scratch / "stats.json")]  # fmt: skip
        command = ["ip", "netns", "exec", router, *argv]
        if group is not None:  # joins its cgroup, then becomes the delay line
            command = ["sh", "-c", 'echo $$ > "$0" && exec "$@"', str(group), *command]
        self.process = subprocess.Popen(
            command, start_new_session=True, stdout=subprocess.PIPE, text=True
        )
        ready, _, _ = select.select([self.process.stdout], [], [], start_s)
        if not ready or self.process.stdout.readline().strip() != "ready":
            code = self.process.poll()
            with contextlib.suppress(ProcessLookupError):  # nothing of it stays behind
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
            shutil.rmtree(self.scratch, ignore_errors=True)
            raise RuntimeError(
                f"the delay line did not start within {start_s:.0f} s (exit code {code})"
            )

    def set(self, address: str, rtt_ms: float, jitter_ms: float) -> None:
        self.links[address] = [rtt_ms, jitter_ms]
        tmp = self.table.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.links))
        tmp.replace(self.table)
        self.process.send_signal(signal.SIGHUP)  # it reads the table again

    def stop(self, stopper) -> dict | None:
        """Stop it with `stopper(process)`; what it saw, or None if it wrote nothing."""
        from swarmrl.procs import cpu_s

        used = round(cpu_s(self.process.pid), 2)
        stopper(self.process)  # it writes its stats as it leaves
        path = self.scratch / "stats.json"
        try:
            stats = json.loads(path.read_text()) | {"cpu_s": used}
        except (OSError, ValueError):  # recovered: killed before or while writing them
            stats = None
        shutil.rmtree(self.scratch, ignore_errors=True)
        return stats


def serve(table: Path, queue: int, seed: int, stats: Path | None) -> None:
    from netfilterqueue import NetfilterQueue

    def links() -> dict[str, tuple[float, float]]:
        return {a: tuple(v) for a, v in json.loads(table.read_text()).items()}

    line = DelayLine(links(), seed)
    nfq = NetfilterQueue()
    nfq.bind(queue, lambda p: line.take(p, time.monotonic()), max_len=QUEUE_MAX,
             range=HEADER, sock_len=64 * 1024 * 1024)  # fmt: skip
    stop = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.append(1))
    reload = []  # SIGHUP: the harness added a link to the table
    signal.signal(signal.SIGHUP, lambda *_: reload.append(1))
    sel = selectors.DefaultSelector()
    sel.register(nfq.get_fd(), selectors.EVENT_READ)
    print("ready", flush=True)
    wait: float | None = 0.5
    try:
        while not stop:
            if reload:
                reload.clear()
                line.load(links())
            if sel.select(0.05 if wait is None else min(wait, 0.05)):
                nfq.run(block=False)
            wait = line.release(time.monotonic())
    finally:
        line.release(float("inf"))  # nothing is kept back on the way out
        if stats is not None:
            stats.write_text(json.dumps({"packets": line.count, "delays_ms": line.delays_ms}))
        nfq.unbind()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--table", type=Path, required=True, help="JSON: address -> [rtt_ms, jitter_ms]")
    p.add_argument("--queue", type=int, default=0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--stats", type=Path, help="write what was seen here on exit")
    a = p.parse_args(argv)
    serve(a.table, a.queue, a.seed, a.stats)
    return 0


if __name__ == "__main__":
    sys.exit(main())
