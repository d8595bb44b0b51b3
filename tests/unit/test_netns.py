"""The emulated network (swarmrl/sim/netns.py): nodes in namespaces of their own on
shaped links, with CPU shares, and nothing left behind however the harness ends."""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest

from swarmrl.sim import netns

OK, WHY = netns.available()
pytestmark = pytest.mark.skipif(not OK, reason=f"no network namespaces here: {WHY}")


def _left(prefix: str) -> list[str]:
    """Namespaces, cgroups and host legs whose names start with `prefix`'s PREFIX<pid>."""
    names = [n for n in netns.namespaces() if n.startswith(prefix)]
    groups = [g.name for g in netns.CGROUP_CPU.glob(f"{prefix}*")]
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    legs = [x for x in links.split() if x.startswith(prefix.split("-")[0] + "h")]
    scratch = [str(d) for d in Path(tempfile.gettempdir()).glob(f"{prefix}*")]
    return names + groups + legs + scratch


def test_nodes_talk_over_shaped_links_and_leave_nothing():
    net = netns.Network("t1")
    with net:
        server = net.add("server", netns.Link(50))
        client = net.add("client", netns.Link(10), cpu=0.5)
        assert server.address == "198.18.0.1" and client.address == "198.18.0.2"
        assert net.shaping(server) == {"up": 50.0, "down": 50.0}
        assert net.shaping(client) == {"up": 10.0, "down": 10.0}
        # a weight without a share: a claim on a busy machine, no cap
        heavy = net.add("heavy", netns.Link(100), weight=8192)
        assert (heavy.cgroup / "cpu.shares").read_text().strip() == "8192"
        assert (heavy.cgroup / "cpu.cfs_quota_us").read_text().strip() == "-1"
        assert (client.cgroup / "cpu.cfs_quota_us").read_text().strip() == "50000"
        with pytest.raises(ValueError, match="cpu weight"):
            net.add("weightless", weight=1)
        # no route but the emulated network's: nothing outside is reachable
        routes = net.run(client, ["ip", "-j", "route"], capture_output=True, text=True)
        assert [r["dst"] for r in __import__("json").loads(routes.stdout)] == ["198.18.0.0/15"]
        web = net.start(server, [sys.executable, "-m", "http.server", "--bind", server.address,
                                 "8000"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
        fetch = textwrap.dedent(f"""
            import time, urllib.request
            for _ in range(100):
                try:
                    print(len(urllib.request.urlopen("http://{server.address}:8000/", timeout=5).read()))
                    break
                except OSError:
                    time.sleep(0.1)
            print(open("/proc/self/cgroup").read())
        """)  # fmt: skip
        got = net.start(client, [sys.executable, "-c", fetch], stdout=subprocess.PIPE, text=True)
        out, _ = got.communicate(timeout=60)
        lines = out.splitlines()
        assert int(lines[0]) > 0  # the directory listing came over the link
        assert f"{net.tag}/client" in out  # the client ran in its cgroup
        assert web.poll() is None
    assert web.poll() is not None  # stopped with the network
    assert _left(net.tag) == []


ECHO = """
import socket, sys
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
u.setsockopt(socket.SOL_SOCKET, 33, 1 << 23)  # SO_RCVBUFFORCE (root)
u.bind((sys.argv[1], 9000))
while True:
    data, peer = u.recvfrom(2048)
    u.sendto(data, peer)
"""

# From the delayed node: round trips one at a time, then a burst for the loss.
PINGS = """
import json, socket, sys, time
host, pings, burst = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
u.setsockopt(socket.SOL_SOCKET, 33, 1 << 23)  # SO_RCVBUFFORCE: the echoes wait
u.settimeout(1.0)
rtts = []
for i in range(pings):
    t0 = time.monotonic()
    u.sendto(i.to_bytes(4, "big"), (host, 9000))
    try:
        while int.from_bytes(u.recvfrom(64)[0], "big") != i:
            pass
        rtts.append((time.monotonic() - t0) * 1000.0)
    except socket.timeout:
        pass
got = set()
for i in range(1000, 1000 + burst):
    u.sendto(i.to_bytes(4, "big"), (host, 9000))
    time.sleep(0.0005)
u.settimeout(1.5)
try:
    while True:
        got.add(int.from_bytes(u.recvfrom(64)[0], "big"))
except socket.timeout:
    pass
print(json.dumps({"rtts": rtts, "echoed": len([g for g in got if g >= 1000])}))
"""


@pytest.mark.skipif(
    importlib.util.find_spec("netfilterqueue") is None, reason="NetfilterQueue: make netqueue"
)
def test_a_link_delays_jitters_and_loses_what_it_was_set_to():
    """Round trips (the sum of both links', with the jitter's spread) and loss each way
    as set, measured by a packet's own round trip; a cut node is cut off until healed;
    without its delay line the network carries nothing (no quiet fallback to an
    undelayed bridge)."""
    import json

    net = netns.Network("t4")
    with net:
        server = net.add("server", netns.Link(100, rtt_ms=20.0))
        client = net.add("client", netns.Link(10, rtt_ms=60.0, jitter_ms=10.0, loss=0.05),
                         block=40)  # fmt: skip
        assert client.address == "198.18.40.1" and server.address == "198.18.0.1"
        assert net.impairment(client) == pytest.approx(
            {"rtt_ms": 60.0, "jitter_ms": 10.0, "loss_up": 0.05, "loss_down": 0.05}
        )
        net.start(server, [sys.executable, "-c", ECHO, server.address])
        time.sleep(0.5)
        out = net.run(client, [sys.executable, "-c", PINGS, server.address, "30", "2000"],
                      capture_output=True, text=True, timeout=60).stdout  # fmt: skip
        seen = json.loads(out)
        rtts = sorted(seen["rtts"])
        assert len(rtts) >= 20
        assert 72.0 <= rtts[len(rtts) // 2] <= 90.0  # 20 + 60 ms, the jitter around it
        assert rtts[-1] - rtts[0] >= 5.0  # jitter: not one fixed delay
        # 2000 echoes cross the client's link twice at 5% each: 9.75% lost, sd 0.66%
        lost = 1.0 - seen["echoed"] / 2000
        assert 0.07 <= lost <= 0.125, lost
        net.cut(["client"])  # a partition, then healed
        cut = net.run(client, [sys.executable, "-c", PINGS, server.address, "2", "10"],
                      capture_output=True, text=True, timeout=60).stdout  # fmt: skip
        assert json.loads(cut) == {"rtts": [], "echoed": 0}
        net.heal(["client"])
        healed = net.run(client, [sys.executable, "-c", PINGS, server.address, "5", "0"],
                         capture_output=True, text=True, timeout=60).stdout  # fmt: skip
        assert len(json.loads(healed)["rtts"]) >= 3  # 5 pings, each 10% lost
        net._delayline.process.kill()
        net._delayline.process.wait()
        quiet = net.run(client, [sys.executable, "-c", PINGS, server.address, "2", "10"],
                        capture_output=True, text=True, timeout=60).stdout  # fmt: skip
        assert json.loads(quiet) == {"rtts": [], "echoed": 0}
    stats = net.delay_stats()  # the killed line wrote none; its CPU was read before
    assert stats is None or (stats["packets"] > 0 and stats["cpu_s"] >= 0)
    assert _left(net.tag) == []


def test_an_error_inside_leaves_nothing():
    net = netns.Network("t2")
    with pytest.raises(RuntimeError, match="boom"), net:
        node = net.add("a", netns.Link(1), cpu=0.1)
        sleeper = net.start(node, ["sleep", "600"])
        raise RuntimeError("boom")
    assert sleeper.poll() is not None
    assert _left(net.tag) == []


HARNESS = """
import subprocess, sys, time
from swarmrl.sim import netns
with netns.Network("child") as net:
    node = net.add("a", netns.Link(5), cpu=0.2)
    net.attach_host()
    p = net.start(node, ["sleep", "600"])
    print(p.pid, flush=True)
    time.sleep(600)
"""


def _harness() -> tuple[subprocess.Popen, int]:
    child = subprocess.Popen([sys.executable, "-c", HARNESS], stdout=subprocess.PIPE, text=True)
    sleeper = int(child.stdout.readline())
    return child, sleeper


def _gone(pid: int, seconds: float = 10.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.05)
    return False


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_ctrl_c_or_sigterm_leaves_nothing(sig):
    child, sleeper = _harness()
    prefix = f"{netns.PREFIX}{child.pid}-"
    try:
        assert _left(prefix), "the harness made nothing"
        child.send_signal(sig)
        child.wait(30)
        assert _gone(sleeper)
        assert _left(prefix) == []
    finally:
        child.kill()
        netns.sweep()


def test_a_harness_killed_outright_is_swept_by_the_next():
    child, sleeper = _harness()
    prefix = f"{netns.PREFIX}{child.pid}-"
    child.kill()
    child.wait()
    assert _left(prefix) and not _gone(sleeper, 0.5)  # left behind, still running
    removed = netns.sweep()
    assert removed and _left(prefix) == []
    assert _gone(sleeper)


def test_the_host_can_watch_the_nodes_and_its_leg_goes_with_the_network():
    import urllib.request

    net = netns.Network("t3")
    with net:
        node = net.add("a", netns.Link(10))
        here = net.attach_host()
        assert here == "198.19.255.254"
        net.start(node, [sys.executable, "-m", "http.server", "--bind", node.address, "8000"],
                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
        deadline = time.monotonic() + 30
        while True:
            try:
                assert urllib.request.urlopen(f"http://{node.address}:8000/", timeout=5).read()
                break
            except OSError:
                assert time.monotonic() < deadline, "the node's server never answered"
                time.sleep(0.1)
    links = subprocess.run(["ip", "-br", "link"], capture_output=True, text=True).stdout
    assert f"{netns.PREFIX}{os.getpid()}h" not in links
    routes = subprocess.run(["ip", "route"], capture_output=True, text=True).stdout
    assert "198.18.0.0/15" not in routes


def test_an_emulated_swarm_places_each_process_on_its_node_and_relays_in_a_tree(tmp_path):
    """The launcher's plan on an emulated network: every process's command runs in its
    own namespace, at its own address; relays 1 and 2 mirror relay 0, workers fetch from
    the last level, and the orchestrator accepts relays from the emulated subnet."""
    import json

    from swarmrl.config import load_config
    from swarmrl.launch.swarm import plan_swarm
    from swarmrl.sim.emulated import Emulated, Layout

    cfg = load_config(None, [f"runs_dir={json.dumps(str(tmp_path))}", "name=e",
                             "launcher.workers=2", "shardcast.relays=3", "validator.count=1"])  # fmt: skip
    (cfg.run_dir / "logs").mkdir(parents=True)
    with netns.Network("plan") as net:
        layout = Layout(links={"worker": 10, "relay": 50}, cpus={"worker": 0.5}, levels=2)
        swarm = plan_swarm(cfg, None, [], False, ["other-model"], Emulated(net, layout))
        for p in swarm.procs:
            node = net.nodes[p.name]
            assert node.namespace in p.argv and p.argv.index(node.namespace) < p.argv.index("-m")
            assert (node.cgroup is not None) == p.name.startswith("worker")
        addr = {name: n.address for name, n in net.nodes.items()}
        assert len(set(addr.values())) == len(addr)
        assert net.shaping(net.nodes["worker-1"]) == {"up": 10.0, "down": 10.0}

        def arg(p, flag):
            return p.argv[p.argv.index(flag) + 1]

        origin = f"http://{addr['trainer']}:8000"
        assert arg(swarm.relays[0], "--upstream") == origin
        assert ["--inner" in r.argv for r in swarm.relays] == [True, False, False]
        for r in swarm.relays[1:]:
            assert arg(r, "--upstream") == f"http://{addr['relay-0']}:8000"
        servers = next(a for a in swarm.trainer.argv if a.startswith("shardcast.servers="))
        assert json.loads(servers.split("=", 1)[1]) == [
            f"http://{addr['relay-1']}:8000",
            f"http://{addr['relay-2']}:8000",
        ]
        assert f'shardcast.host="{addr["trainer"]}"' in swarm.trainer.argv
        assert swarm.url == f"http://{addr['orchestrator']}:8000"
        nets = next(
            a for a in swarm.orchestrator.argv if a.startswith("orchestrator.relay_networks=")
        )
        assert "198.18.0.0/15" in nets
    assert _left(net.tag) == []
