"""The capacity planner (swarmrl/plan): the shared-capacity split, the simpy model's
arithmetic where it can be worked by hand, its response to the work cap (Little's
law), costs read from a run's records, and the CLI's errors."""

from __future__ import annotations

import dataclasses
import json
import sqlite3
from datetime import datetime
from pathlib import Path

import pytest
import simpy

from swarmrl.cli import main
from swarmrl.plan import calibrate
from swarmrl.plan.fluid import Fluid, split
from swarmrl.plan.model import Costs, Swarm, Workers, simulate


def test_split_is_fair_by_weight_within_caps():
    assert split(2.0, [(float("inf"), 1), (float("inf"), 1)]) == [1.0, 1.0]
    assert split(2.0, [(0.5, 1), (float("inf"), 1)]) == [0.5, 1.5]  # the cap frees room
    assert split(3.0, [(float("inf"), 2048), (float("inf"), 1024)]) == [2.0, 1.0]
    assert split(1.0, [(0.25, 1)] * 8) == [0.125] * 8  # more demand than cores
    assert split(4.0, [(0.25, 1)] * 8) == [0.25] * 8  # capacity left idle, caps hold


def test_a_fluid_serves_jobs_side_by_side():
    env = simpy.Environment()
    link = Fluid(env, 2.0)
    done = {}

    def job(name, amount):
        yield link.use(amount)
        done[name] = env.now

    env.process(job("a", 2.0))
    env.process(job("b", 4.0))
    env.run()
    # both at 1/s until a ends at 2 s; b then alone at 2/s for its last 2 units
    assert done == pytest.approx({"a": 2.0, "b": 3.0})


def test_a_groups_jobs_share_its_cap_and_claim_with_one_weight():
    env = simpy.Environment()
    cores = Fluid(env, 2.0)
    node = cores.group(cap=0.5, weight=1024)  # a worker's cgroup: half a core
    busy = cores.group(weight=1024)  # a process of the same weight, uncapped
    done = {}

    def job(name, amount, group, tag):
        yield cores.use(amount, group=group, tag=tag)
        done[name] = env.now

    env.process(job("file", 1.0, node, "worker file"))
    env.process(job("fetch", 0.5, node, "worker fetch"))  # shares the node's half core
    env.process(job("other", 3.0, busy, "other"))
    env.run()
    # the node's two jobs split 0.5 core: the fetch ends at 2 s, the file then alone
    # at 0.5 core for its last 0.5 core-s; the other process has 1.5 cores throughout
    assert done == pytest.approx({"fetch": 2.0, "file": 3.0, "other": 2.0})
    assert cores.used_by == pytest.approx({"worker file": 1.0, "worker fetch": 0.5, "other": 3.0})


ROOT = Path(__file__).resolve().parents[2]
COSTS = Costs(file_s=4.0, train_s=1.0, validate_s=0.5, load_s=0.2, version_mb=10.0)


def test_the_model_trains_every_step_and_times_the_tree():
    swarm = Swarm(workers=[Workers(8, 80.0)], steps=5, batch_groups=8, groups_per_file=2,
                  relays=[1], relay_mbit=80.0, origin_mbit=80.0, validators=1,
                  sample_rate=0.0, assign="slack")  # fmt: skip
    out = simulate(swarm, Costs(**{**COSTS.__dict__, "train_s": 30.0}))  # no overlapping versions
    assert out.steps == 5
    assert out.files["trained"] == 5 * 8 // 2
    # 10 MB at 10 MB/s from the origin to the one relay
    assert out.weights_lag_s["1"]["p50"] == pytest.approx(1.0)
    # meanwhile 9 nodes share the relay's 10 MB/s (it passes shards on as they arrive):
    # 9 s, all finishing together, after the relay has all of it
    assert out.weights_lag_s["nodes"]["p50"] == pytest.approx(9.0)
    assert out.origin_mb == pytest.approx(10.0 * 5)
    # an origin of 1 MB/s: the relay has it after 10 s, and so do the nodes, not sooner
    slow = simulate(
        dataclasses.replace(swarm, origin_mbit=8.0), Costs(**{**COSTS.__dict__, "train_s": 30.0})
    )
    assert slow.weights_lag_s["nodes"]["p50"] == pytest.approx(10.0)
    # step n + 1 opens while n trains, and a node holding n - 1 gets no work for it (the
    # slack rule): each step waits for version n to reach the nodes (9 s), be loaded
    # (0.2 s) and make a file (4 s), and the workers see it at their next poll (every
    # 0.2 s while they wait: the AskPacer)
    busy = out.trainer_busy_fraction  # rounded to 3 places
    assert 30 / (30 + 9 + 0.2 + 0.2 + 4) - 1e-3 <= busy <= 30 / (30 + 9 + 0.2 + 4) + 1e-3


def test_more_work_out_makes_files_staler():
    """Under the rule before pipelining (`slack`), which hands out work up to the cap."""

    def run(batches: int):
        swarm = Swarm(workers=[Workers(32, 100.0, cores=0.25)], steps=10, batch_groups=16,
                      groups_per_file=2, max_pending_groups=16 * batches, relays=[1, 2],
                      validators=2, host_cores=2.0, assign="slack")  # fmt: skip
        return simulate(swarm, COSTS)

    one, three = run(1), run(3)
    assert three.stale_fraction > one.stale_fraction
    assert three.files["generated"] > one.files["generated"]


def test_pipelined_steps_make_no_file_that_goes_stale_and_never_starve_a_step():
    """Pipelined (the orchestrator's default): a node a version behind fills the step
    being collected, and no work is queued past what its version is fresh for, nor past
    the run's last step. Against the slack rule on the same swarm: far fewer stale
    files, fewer worker-seconds told to wait for a version, and a step short of signal
    (70% of its groups without signal) still gets the work it needs."""

    # the costs measured under the emulated swarm's load (docs/results.md), its links
    costs = Costs(**json.loads((ROOT / "docs" / "plan-costs-open-swarm.json").read_text()))
    links = [Workers(10, 10.0, cores=0.25), Workers(11, 50.0, cores=0.25),
             Workers(11, 100.0, cores=0.25)]  # fmt: skip

    def run(assign: str, signal: float = 1.0):
        swarm = Swarm(workers=links, steps=12, batch_groups=16, groups_per_file=2,
                      max_pending_groups=32, relays=[1, 2], validators=2, host_cores=2.0,
                      sample_rate=0.25, assign=assign)  # fmt: skip
        return simulate(swarm, dataclasses.replace(costs, signal=signal))

    slack, pipelined = run("slack"), run("pipelined")
    assert slack.stale_fraction > 0.1
    assert pipelined.stale_fraction <= 0.02
    assert pipelined.worker_wait_s.get("stale-policy", 0.0) < slack.worker_wait_s["stale-policy"]
    assert pipelined.files["trained"] == slack.files["trained"]
    short = run("pipelined", signal=0.3)
    # a step short of signal ends sooner or later than its estimate: some files of the
    # oldest usable version miss their step (4.8% here against 0% by the slack rule)
    assert short.steps == 12 and short.stale_fraction < 0.1


def test_costs_are_read_from_a_runs_records(tmp_path):
    run = tmp_path / "run"
    (run / "logs").mkdir(parents=True)
    (run / "orchestrator").mkdir()
    metrics = [{"step": s, "train_s": t, "groups": 16, "dropped_groups": d}
               for s, t, d in ((1, 1.0, 4), (2, 2.0, 0), (3, 3.0, 0))]  # fmt: skip
    (run / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in metrics))
    (run / "logs" / "worker-0.log").write_text(
        "2026-11-29 05:00:00,000 swarmrl.worker INFO node ab (honest) joining run r at x\n"
        "2026-11-29 05:00:12,500 swarmrl.worker INFO registered: stake 100.0, length budget 12\n"
        "2026-11-29 05:00:20,000 swarmrl.worker INFO step 1 policy 0: 16 samples, reward 0.5, "
        "30 tok/s in 2.00s -> rollouts/a-g4.parquet\n"
        "2026-11-29 05:00:29,000 swarmrl.shardcast.client INFO version 1: 8.0 MB in 2.00s "
        "(3.00s after publish); servers {}\n"
        "2026-11-29 05:00:30,000 swarmrl.worker INFO loaded policy version 1 in 0.40s\n"
        "2026-11-29 05:00:40,000 swarmrl.worker INFO step 2 policy 1: 16 samples, reward 0.5, "
        "30 tok/s in 4.00s -> rollouts/b-g4.parquet\n"
    )
    (run / "verdicts.jsonl").write_text(
        "".join(json.dumps({"accepted": True, "seconds": s}) + "\n" for s in (0.5, 0.7, 0.9))
    )
    (run / "published.jsonl").write_text(
        json.dumps({"version": 1, "full_bytes": 8_000_000, "patch_bytes": 6e6,
                    "patch_dropped": True}) + "\n"
        + json.dumps({"version": 2, "full_bytes": 8_000_000, "patch_bytes": 2_000_000,
                      "patch_dropped": False}) + "\n"
    )  # fmt: skip
    db = sqlite3.connect(run / "orchestrator" / "state.sqlite")
    db.execute("CREATE TABLE files (key TEXT, size INTEGER, created REAL, submitted REAL)")
    db.executemany("INSERT INTO files VALUES (?, ?, ?, ?)",
                   [("a", 40_000, 10.0, 10.4), ("b", 60_000, 20.0, 20.8), ("c", 50_000, 30.0, None)])  # fmt: skip
    db.commit()
    db.close()
    c = calibrate.from_run(run, worker_cores=0.5)
    assert c.file_s == pytest.approx(1.5)  # median of 2 s and 4 s, at half a core
    assert c.train_s == 2.0 and c.validate_s == 0.7 and c.load_s == pytest.approx(0.2)
    assert c.start_s == 12.5 and c.file_mb == 0.05 and c.groups == 4
    assert c.submit_s == pytest.approx(0.3)  # median of 0.4 s and 0.8 s, at half a core
    assert c.fetch_s_per_mb == pytest.approx(0.125)  # 2 s for 8 MB, at half a core
    assert c.version_mb == pytest.approx(5.0)  # median of 8 MB (patch dropped) and 2 MB
    assert c.signal == pytest.approx(1 - 4 / 52, abs=1e-3)
    with pytest.raises(ValueError, match="not a run directory"):
        calibrate.from_run(tmp_path)


def _stamp(t: float) -> str:
    return datetime.fromtimestamp(t).strftime("%Y-%m-%d %H:%M:%S,%f")[:23]


def test_an_emulated_runs_cpu_record_gives_the_costs_under_load(tmp_path):
    """A run of the emulated swarm whose nodes burn known CPU: 0.1 core-s per version
    taken, 0.05 per file, 0.02 cores besides, 0.4 per trainer step, 0.01 per check."""
    run = tmp_path / "run"
    (run / "logs").mkdir(parents=True)
    (run / "orchestrator").mkdir()
    t0, steps = 1_800_000_000.0, 60  # a step every 2 s from t0
    logs = {"trainer": [f"{_stamp(t0 - 30)} swarmrl.trainer INFO trainer rank 0 of 1 computes on cpu"],
            "validator-0": [f"{_stamp(t0 - 30)} swarmrl.validator INFO validator 0 started on cpu"],
            "relay-0": [f"{_stamp(t0 - 30)} swarmrl.shardcast.relay INFO relay serving /r at x"],
            "orchestrator": [f"{_stamp(t0 - 30)} swarmrl.orchestrator INFO orchestrator of run r"]}  # fmt: skip
    links = {"validator-0": 100}
    verdicts, published, files = [], [], []
    cpu = {"trainer": 0.0, "validator-0": 0.0, "relay-0": 0.0, "orchestrator": 0.0}
    made = {}
    for w in range(8):
        name = f"worker-{w}"
        links[name] = 50
        cpu[name] = 3.0  # its start, all spent before it registered
        logs[name] = [f"{_stamp(t0 - 20)} swarmrl.worker INFO node n{w} (honest) joining run r at x",
                      f"{_stamp(t0 - 10)} swarmrl.worker INFO registered: stake 100.0"]  # fmt: skip
        made[name] = 0
    samples = [{"time": t0 - 9, "step": 0, "cpu_s": dict(cpu)}]  # just after registering
    for k in range(1, steps + 1):
        t = t0 + 2 * k
        published.append({"version": k, "time": t + 0.1, "full_bytes": 7_000_000})
        logs["trainer"].append(
            f"{_stamp(t)} swarmrl.trainer INFO step {k} level 0 wait 1.0s train 0.3s"
        )
        cpu["trainer"] += 0.4
        cpu["orchestrator"] += 0.0
        for w in range(8):
            name = f"worker-{w}"
            cpu[name] += 0.02 * 2
            if k % (1 + w % 3) == 0:  # workers 0, 3, 6 every version, the others less often
                # 7 MB on 50 Mbit/s is 1.12 s: 0.3 s more
                logs[name].append(f"{_stamp(t + 1.5)} swarmrl.shardcast.client INFO version {k}: "
                                  f"7.0 MB in 1.42s (1.5s after publish); servers {{}}")  # fmt: skip
                cpu[name] += 0.1
            for f in range(w % 4):  # 0 to 3 files a step
                key = f"rollouts/{k}-{w}-{f}-g2.parquet"
                logs[name].append(f"{_stamp(t + 1.0 + 0.1 * f)} swarmrl.worker INFO step {k} policy "
                                  f"{k - 1}: 16 samples, reward 0.5 in 0.20s -> {key}")  # fmt: skip
                cpu[name] += 0.05
                cpu["validator-0"] += 0.01
                cpu["orchestrator"] += 0.02
                logs["validator-0"].append(
                    f"{_stamp(t + 1.5)} swarmrl.validator INFO accepted {key}: 16 samples, 0.01s"
                )
                verdicts.append({"key": key, "seconds": 0.01, "time": t + 1.5, "accepted": True})
                files.append((key, 12_000, t + 1.2, t + 1.3, k + 1))
        logs["validator-0"].append(f"{_stamp(t + 1.5)} swarmrl.shardcast.client INFO version {k}: "
                                   f"7.0 MB in 0.86s (0.9s after publish); servers {{}}")  # fmt: skip
        cpu["validator-0"] += 0.1 + 0.02 * 2
        cpu["relay-0"] += 0.05
        samples.append({"time": t + 1.9, "step": k, "cpu_s": dict(cpu)})
    (run / "cpu.jsonl").write_text("".join(json.dumps(x) + "\n" for x in samples))
    (run / "links.json").write_text(json.dumps(links))
    for name, lines in logs.items():
        (run / "logs" / f"{name}.log").write_text("\n".join(lines) + "\n")
    (run / "verdicts.jsonl").write_text("".join(json.dumps(v) + "\n" for v in verdicts))
    (run / "published.jsonl").write_text("".join(json.dumps(p) + "\n" for p in published))
    metrics = [{"step": k, "train_s": 0.3, "groups": 16} for k in range(1, steps + 1)]
    (run / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in metrics))
    db = sqlite3.connect(run / "orchestrator" / "state.sqlite")
    db.execute("CREATE TABLE files (key TEXT, size INTEGER, created REAL, submitted REAL,"
               " consumed_step INTEGER)")  # fmt: skip
    db.executemany("INSERT INTO files VALUES (?, ?, ?, ?, ?)", files)
    db.commit()
    db.close()
    c = calibrate.from_run(run, worker_cores=0.25)
    assert c.fetch_s_per_mb == pytest.approx(0.1 / 7.0, rel=0.02)  # taking a version in
    assert c.file_s == pytest.approx(0.05, rel=0.02) and c.idle_cores == pytest.approx(
        0.02, rel=0.02
    )
    assert c.start_s == pytest.approx(3.0)
    assert c.train_s == pytest.approx(0.3)  # one thread: no more than the update's seconds
    assert c.publish_s == pytest.approx(0.1, abs=0.002)
    # a file of step k is accepted at t + 1.5 and trained at step k + 1, whose update
    # (0.3 s) ends at t + 2: 0.2 s from the last acceptance to the update's start
    assert c.collect_s == pytest.approx(0.2, abs=0.002)
    assert c.validate_s == pytest.approx(0.01, rel=0.05)
    assert c.orchestrator_s == pytest.approx(0.02, rel=0.02)
    assert c.fetch_latency_s == pytest.approx(0.3, abs=0.01)  # 1.42 s for 1.12 s of bytes
    # the relay's 0.05 core-s a step over the 7 MB versions taken a step: 3 workers take
    # every one, 3 every second, 2 every third, and the validator every one
    assert c.relay_s_per_mb == pytest.approx(0.05 / (7 * (3 + 3 / 2 + 2 / 3 + 1)), rel=0.05)
    # a run too short for a steady window says so
    (run / "cpu.jsonl").write_text("".join(json.dumps(x) + "\n" for x in samples[:13]))
    with pytest.raises(ValueError, match="steady window"):
        calibrate.from_run(run, worker_cores=0.25)


def test_the_cli_plans_from_a_costs_file_and_names_bad_input(tmp_path, capsys):
    costs = tmp_path / "costs.json"
    costs.write_text(json.dumps(COSTS.__dict__))
    assert main(["plan", "--costs", str(costs), "--workers", "6", "--steps", "3",
                 "--relays", "1", "--sample-rate", "0.5"]) == 0  # fmt: skip
    out = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert out["outcome"]["steps"] == 3 and out["costs"]["file_s"] == 4.0
    assert main(["plan", "--costs", str(costs), "--links", "fast"]) != 0
    assert "--links 'fast'" in capsys.readouterr().err
    assert main(["plan", "--workers", "3"]) != 0
    assert "one of --costs" in capsys.readouterr().err
    assert main(["plan", "--costs", str(tmp_path / "none.json")]) != 0
    assert "none.json" in capsys.readouterr().err


def test_projected_trees_keep_one_fan_out_per_level():
    from swarmrl.plan.project import tree

    assert tree(64, 1) == [64]
    assert tree(64, 2) == [8, 64]
    assert tree(8, 3) == [2, 4, 8]
