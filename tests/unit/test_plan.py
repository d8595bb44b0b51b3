"""The capacity planner (swarmrl/plan): the shared-capacity split, the simpy model's
arithmetic where it can be worked by hand, its response to the work cap (Little's
law), costs read from a run's records, and the CLI's errors."""

from __future__ import annotations

import dataclasses
import json
import sqlite3

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


COSTS = Costs(file_s=4.0, train_s=1.0, validate_s=0.5, load_s=0.2, version_mb=10.0)


def test_the_model_trains_every_step_and_times_the_tree():
    swarm = Swarm(workers=[Workers(8, 80.0)], steps=5, batch_groups=8, groups_per_file=2,
                  relays=[1], relay_mbit=80.0, origin_mbit=80.0, validators=1,
                  sample_rate=0.0)  # fmt: skip
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
    assert out.trainer_busy_fraction == pytest.approx(1.0)  # files come in during each update


def test_more_work_out_makes_files_staler():
    def run(batches: int):
        swarm = Swarm(workers=[Workers(32, 100.0, cores=0.25)], steps=10, batch_groups=16,
                      groups_per_file=2, max_pending_groups=16 * batches, relays=[1, 2],
                      validators=2, host_cores=2.0)  # fmt: skip
        return simulate(swarm, COSTS)

    one, three = run(1), run(3)
    assert three.stale_fraction > one.stale_fraction
    assert three.files["generated"] > one.files["generated"]


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
