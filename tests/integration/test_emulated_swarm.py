"""A whole swarm on the emulated network (sim/emulated.py): each process in its own
namespace on a shaped link with a round trip and loss, relays in a tree of two levels,
every worker a stranger, a cheater among them. The default suite keeps the network's
own tests (tests/unit/test_netns.py)."""

from __future__ import annotations

import json

import pytest

from swarmrl.sim import netns
from tests.integration.conftest import ROOT

OK, WHY = netns.available()


@pytest.mark.slow  # about 80 s on 2 cores
@pytest.mark.skipif(not OK, reason=f"no network namespaces here: {WHY}")
def test_a_swarm_on_shaped_links_with_a_relay_tree_trains_and_ejects_its_cheater(
    tiny_model, tmp_path
):
    from swarmrl.config import load_config
    from swarmrl.launch.swarm import launch
    from swarmrl.sim.emulated import Emulated, Layout

    config = str(ROOT / "configs" / "tiny.toml")
    overrides = [f"runs_dir={json.dumps(str(tmp_path / 'runs'))}",
                 f"model.path={json.dumps(str(tiny_model))}", "trainer.steps=6",
                 "launcher.workers=2", "shardcast.relays=3", "validator.count=1",
                 "orchestrator.register_work_bits=8", "launcher.trust_own_workers=false"]  # fmt: skip
    cfg = load_config(config, overrides)
    # an open swarm: no worker trusted, each in a /24 of its own, the cheater in worker-0's;
    # the workers' links 120 ms round trips with jitter and loss
    layout = Layout(links={"worker": 10, "cheater": 10, "relay": 50, "trainer": 100,
                           "orchestrator": 100, "validator": 50}, levels=2,
                    paths={"worker": (120.0, 12.0, 0.005), "cheater": (60.0, 6.0, 0.0)},
                    blocks={"worker-0": 1, "worker-1": 2, "cheater-0": 1})  # fmt: skip
    with netns.Network("it") as net:
        net.attach_host()
        code = launch(cfg, config, overrides, resume=False, fresh=True, cheaters=1,
                      cheats=["inflated-reward"], place=Emulated(net, layout))  # fmt: skip
        addr = {name: n.address for name, n in net.nodes.items()}
    assert code == 0
    assert [n for n in netns.namespaces() if n.startswith(net.tag)] == []
    logs = cfg.run_dir / "logs"
    relay0 = f"http://{addr['relay-0']}:8000"
    for i in (1, 2):  # the second level mirrors the first
        assert f"following ['{relay0}']" in (logs / f"relay-{i}.log").read_text()
    for w in ("worker-0", "worker-1"):  # and only the second level serves the workers
        fetched = [x for x in (logs / f"{w}.log").read_text().splitlines() if "after publish" in x]
        assert fetched and not any(relay0 in x for x in fetched), fetched[:2]
    metrics = [json.loads(x) for x in (cfg.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert max(m.get("step", 0) for m in metrics) == 6
    names = {
        p.read_text().strip(): p.parent.name for p in (cfg.run_dir / "nodes").glob("*/node.pub")
    }
    verdicts = [json.loads(x) for x in (cfg.run_dir / "verdicts.jsonl").read_text().splitlines()]
    honest = [v["accepted"] for v in verdicts if names[v["node"]].startswith("worker-")]
    cheats = [v["accepted"] for v in verdicts if names[v["node"]] == "cheater-0"]
    assert honest and all(honest)
    judged = {names[v["node"]] for v in verdicts if v["accepted"]}
    assert {"worker-0", "worker-1"} <= judged  # each stranger through probation
    assert cheats and not any(cheats)
