"""The emulated network (swarmrl/sim/netns.py): nodes in namespaces of their own on
shaped links, with CPU shares, and nothing left behind however the harness ends."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

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
    return names + groups + legs


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
