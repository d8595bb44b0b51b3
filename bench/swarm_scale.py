"""An open swarm of dozens of nodes on a real-shaped network, with faults and quiet
cheaters, measured end to end (issues 36 and 50).

The run is `swarmrl rl` on the tiny model (configs/tiny.toml), placed on an emulated
network (sim/netns.py, sim/emulated.py): every process in a namespace of its own, on
a link shaped with `tbf`, with a round trip, jitter and loss (sim/delayline.py and
iptables), workers held to a share of a core, every node with a CPU weight
(`WEIGHTS`). The relays form a tree of `--levels` levels.

It is an open swarm: no worker key is trusted (`launcher.trust_own_workers=false`):
each honest worker, as each cheater, pays the proof of work, passes probation and
earns its share as a new key would; only the operator's relays stay trusted (the
launcher's, as an operator's own servers). The workers' addresses spread over
`WORKER_BLOCKS` /24 ranges, several honest nodes to some, the cheaters inside ranges
that honest nodes hold; the orchestrator, trainer, relays and validators each sit in
a range of their own. Nothing in the run is told which node is honest.

Links (`--clean-links` turns round trips, jitter and loss off): each worker's
bandwidth, round trip and loss come from `LINKS`, `RTTS` and `LOSSES` in turn (jitter
a tenth of the round trip); the servers sit on `SERVER_PATH`. The round trip between
two nodes is the sum of their links'.

Everything that happens to the swarm is triggered by the trainer's step, never by the
clock, so that the same events fall at the same point of the run on any machine:

- `--late` workers wait for a flag file that is created at step 2 (they join late);
- at step 3, `--churn` of the workers are killed outright (every process in their
  namespace, SIGKILL): the launcher restarts them, as a node that comes back;
- when the trainer publishes the version after step 4, the first relay is killed
  at once (during that version's broadcast); it is restarted too;
- at step 5 the first validator is killed; at step 6 the orchestrator (SIGKILL),
  which the launcher restarts on its port, from its database;
- at step 8 a partition cuts a quarter of the workers (of every link class) off for
  `--partition` seconds (sim/netns.py, `Network.cut`), then heals;
- at step 12 the last relay (a leaf, which workers fetch from) turns hostile: killed,
  it comes back as sim/hostile_relay.py on its directory, address and port, still
  registered with its key (it heartbeats): it announces versions that do not exist,
  answers the far ones with an older signed manifest, and trickles every byte;
- `--cheaters` dishonest workers (`--cheats`, in turn: the blatant kinds and the
  quiet ones, sim/registry.py's QUIET_CHEATS) run from the start.

The figures come from what the run leaves: metrics.jsonl (steps, the trainer's time
in updates), the orchestrator's database (each file's fate, staleness, each node's
address range), each worker's own record of the files it made (`files.jsonl`, read
by bench/swarm_fates.py), the SHARDCAST clients' logs (weights lag per tree level,
bytes), the orchestrator's Prometheus histograms (scraped every step and across its
restart), the orchestrator's own command line (the keys it trusts), the validators'
backlog, /proc (CPU seconds by role, sampled every 2 s), the delay line's record of
what it held (its packets and a sample of their delays) and eval.json (held-out
accuracy, greedy, before and after). The run directory also gets timeline.json and
timeline.png (nodes up, steps, weights lag per level, files by fate).

Definitions:
- `trusted_workers`: worker and cheater keys in the orchestrator's
  `trusted_workers`, read from its command line while it ran;
- `address_ranges`: the distinct address ranges (orchestrator/ranges.py) the
  orchestrator recorded for the workers and cheaters that registered;
- `links`: per worker link class, the round trip, jitter and loss read back from
  the delay line's table and the router's iptables rules;
- `files`: the ledger's count by fate of every file (honest or not); `files.lost`:
  honest files a worker made whose fate neither side can give: submitted by its
  own record but missing or unsettled on the ledger, or made and never sent by a
  worker nothing killed (bench/swarm_fates.py, `waste`); `files.lost_ledger_view`:
  honest files the ledger holds past their upload, or a worker's log says it
  submitted, whose fate the ledger does not give;
- `open_swarm.wasted`: honest files made and not trained, by why (stale, refused
  at upload, refused blamelessly, voided, held by a worker churn killed, failed,
  still queued at the end), and `wasted_fraction` over the honest files made;
  `by_link_class`: files made and trained per worker-core-second (each worker's
  CPU share times its time from start to the run's end), and the share wasted;
- `honest_waste_fraction`: the done-when figure of issue 52: `open_swarm.wasted`
  without the files still queued at the end, plus `files.lost`, over the honest files
  made; `files_per_core_s_by_link`: per link (Mbit/s), honest files trained per
  worker-core-second (`by_link_class`'s `trained_per_core_s`);
- `first_accepted_file_s`: per honest worker, seconds from its process's start to
  the submission of its first file past the validator (a verdict accepted it, or the
  trainer took it unchecked), p50, p99 and max; it may have gone stale after;
  `first_trained_file_s` the same to its first file trained;
- `cheater_files_trained`: per cheat kind, the cheaters' files the trainer used;
- `files.dropped_no_signal`: groups (not files) the trainer read and dropped for
  lack of signal (metrics' `dropped_groups`);
- `trainer_busy_fraction`: the trainer's update time over the wall time from its
  first step to its last;
- `weights_lag_s`: per level (1 and on: relays; "nodes": workers and validators),
  p50 and p99 of the seconds from a version's publication to a node holding it;
- `orchestrator_service_p99_ms`: the orchestrator's service time (from a request
  being whole to its answer, `swarmrl_service_seconds`), read off the histogram's
  buckets, linear within one; `orchestrator_request_p99_ms` adds the wait for each
  request's body over its client's link (`swarmrl_request_seconds`, from its
  headers on).

With `--costs F` (from `swarmrl plan --calibrate --save-costs F`) the JSON also holds
the planner's prediction of this run (`plan`). Needs root and network namespaces:
where they cannot be made it says why and exits 2 (no fallback to loopback).

    .venv/bin/python bench/swarm_scale.py [--workers 32] [--steps 60] [--seed 0]
        [--publish full|patches|lora] [--assign pipelined|slack]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sqlite3
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import swarm_fates  # noqa: E402  (bench/, beside this file)
import swarm_records as records  # noqa: E402
from swarm_chaos import HOSTILE_STEP, PARTITION_STEP, Chaos  # noqa: E402
from swarm_layout import (  # noqa: E402
    CHEATS,
    LINKS,
    WEIGHTS,
    blocks,
    delay_summary,
    launch_cheats,
    link_classes,
    paths,
)
from swarm_plan import planned, predicted  # noqa: E402

from swarmrl.sim import netns  # noqa: E402

REQUEST = "swarmrl_request_seconds"  # from a request's headers, body wait included
# --publish: what the trainer publishes (shardcast/, trainer/lora.py). A GPU trainer
# publishes bfloat16 (model.publish_dtype auto) with patches from the version before
# (shardcast.patch_max_fraction); `lora` trains rank-4 adapters on every linear layer
# and publishes each version after 0 as the adapter alone (nodes merge it into 0).
PUBLISH = {
    "full": [],
    "patches": ["model.publish_dtype=bfloat16"],
    "lora": ["trainer.lora.rank=4"],
}


def _args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument(
        "--config",
        default=str(ROOT / "configs" / "tiny.toml"),
        help="the run (default: the tiny model's); another model's run keeps its model.path",
    )
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="a further config override (repeatable), after the bench's own")  # fmt: skip
    p.add_argument("--workers", type=int, default=32)
    p.add_argument("--late", type=int, default=4, help="of the workers, joining at step 2")
    p.add_argument("--churn", type=float, default=0.2, help="fraction of workers killed")
    p.add_argument(
        "--no-hostile",
        dest="hostile",
        action="store_false",
        help=f"no relay turns hostile (by default the last does at step {HOSTILE_STEP})",
    )
    p.add_argument(
        "--partition",
        type=float,
        default=30.0,
        help=f"seconds a quarter of the workers are cut off, from step {PARTITION_STEP}",
    )
    p.add_argument("--relays", type=int, default=3)
    p.add_argument("--levels", type=int, default=2)
    p.add_argument("--validators", type=int, default=2)
    p.add_argument("--cheaters", type=int, default=6)
    p.add_argument("--cheats", default=",".join(CHEATS), help="kinds, given to cheaters in turn")
    p.add_argument(
        "--trust-workers",
        action="store_true",
        help="trust the launcher's honest workers (the closed swarm of issue 36)",
    )
    p.add_argument("--clean-links", action="store_true",
                   help="bandwidth only: no round trips, jitter or loss")  # fmt: skip
    # 40 steps: the run within 15 minutes here (60 took 1,012 s with the delayed links)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--groups-per-file", type=int, default=2)
    p.add_argument(
        "--batches-out",
        type=int,
        default=2,
        help="work out at once, in trainer batches (worker.max_pending_groups)",
    )
    p.add_argument("--worker-cpu", type=float, default=0.25, help="cores per worker")
    p.add_argument(
        "--publish",
        choices=sorted(PUBLISH),
        default="full",
        help="what each version after 0 sends down the tree: the whole float32 model, "
        "bfloat16 patches from the version before, or a LoRA adapter",
    )
    p.add_argument("--assign", choices=["pipelined", "slack"], default=None,
                   help="orchestrator.assign (default: the config's)")  # fmt: skip
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--runs", default="/tmp/swarm-scale", help="runs directory")
    p.add_argument(
        "--costs",
        help="planner costs (swarmrl plan --calibrate --save-costs F): "
        "the JSON then holds the planner's prediction of this run beside it",
    )
    p.add_argument("--version-mb", type=float, default=0.0,
                   help="with --costs: MB each version sends, in place of the costs' "
                   "(a --publish other than the run the costs came from)")  # fmt: skip
    p.add_argument("--plot", help="also write the timeline plot here (it is always in the run)")
    p.add_argument(
        "--predict",
        action="store_true",
        help="with --costs: the planner's prediction of a run with these flags, "
        "without running it (committed before the run it predicts)",
    )
    p.add_argument("--replan", action="store_true",
                   help="with --costs: the planner's prediction of the run already in --runs "
                   "(the same flags), without running it")  # fmt: skip
    return p.parse_args()


def hostile_figures(tl: dict, chaos: Chaos, db) -> dict | None:
    """The workers' and validators' weights lag before and after the relay turned
    hostile (timeline seconds), and whether the orchestrator still lists it."""
    turned = [e for e in tl["events"] if e.get("why") == "turns hostile"]
    if not turned:
        return None
    at = turned[0]["at"]
    points = tl["lag"].get("workers and validators", [])
    before = [lag for t, lag in points if t < at]
    after = [lag for t, lag in points if t >= at]
    host = chaos.net.nodes[chaos.hostile_name].address
    listed = db.execute("SELECT url, listed, detail FROM relay_checks").fetchall()
    return {
        "relay": chaos.hostile_name, "step": turned[0]["step"],
        "lag_before_s": records.quantiles(before) | {"max": max(before, default=None)},
        "lag_after_s": records.quantiles(after) | {"max": max(after, default=None)},
        "listed_at_end": [bool(x[1]) for x in listed if host in x[0]],
    }  # fmt: skip


def turns_hostile(argv: list[str], flag: Path) -> list[str]:
    """A relay's command that runs the relay, or, once `flag` exists, the hostile relay
    (sim/hostile_relay.py) on the same directory, address, port and key, registered
    with the orchestrator as the relay was."""
    import shlex

    def arg(name: str) -> str:
        return argv[argv.index(name) + 1]

    hostile = [sys.executable, "-m", "swarmrl.sim.hostile_relay", "--dir", arg("--dir"),
               "--host", arg("--host"), "--port", arg("--port")]  # fmt: skip
    for x in argv:  # it stays registered, heartbeating with the relay's own key
        if x.startswith("orchestrator.url="):
            hostile += ["--orchestrator", json.loads(x.split("=", 1)[1])]
    script = f'if [ -e "$0" ]; then exec {shlex.join(hostile)}; fi; shift; exec "$@"'
    return ["sh", "-c", script, str(flag), "relay", *argv]


def is_tiny(a: argparse.Namespace) -> bool:
    return Path(a.config).resolve() == (ROOT / "configs" / "tiny.toml").resolve()


def setup(a: argparse.Namespace, tiny: Path):
    """The run's config file, its overrides, the config they make and the layout."""
    from swarmrl.config import load_config
    from swarmrl.sim.emulated import Layout

    runs = Path(a.runs)
    config = str(a.config)
    honest = a.workers
    model = [f"model.path={json.dumps(str(tiny))}"] if is_tiny(a) else []
    overrides = [
        f"runs_dir={json.dumps(str(runs))}", *model,
        "name=swarm", f"seed={a.seed}", f"trainer.steps={a.steps}",
        f"launcher.workers={honest}", f"shardcast.relays={a.relays}",
        f"validator.count={a.validators}", "validator.enabled=true",
        "launcher.max_worker_restarts=10",
        # the proof of work costs 2 s of one of the orchestrator's cores by default: a
        # node here has a quarter of a core (--worker-cpu), less while 35 processes load
        # their model at once, and took up to 275 s for it (one cheater never finished
        # in 6 minutes); scaled like the node, it is the same 2 s of the node's own time
        f"orchestrator.register_work_s={2.0 * a.worker_cpu}",
        # many slow workers: small files, and as much work out as async_level allows
        f"worker.groups_per_file={a.groups_per_file}",
    ]  # fmt: skip
    if not a.trust_workers:
        overrides.append("launcher.trust_own_workers=false")
    overrides += PUBLISH[a.publish]
    if a.assign:
        overrides.append(f"orchestrator.assign={a.assign}")
    overrides += a.set
    batch = load_config(config, overrides).trainer.batch_groups
    overrides.append(f"worker.max_pending_groups={a.batches_out * batch}")
    cfg = load_config(config, overrides)
    links = {f"worker-{i}": LINKS[i % len(LINKS)] for i in range(honest)}
    # cheaters on the links work reaches: on 10 Mbit/s a node of this swarm holds a
    # version two or three steps old (7.2 MB every ~6.4 s), so it gets no work (11
    # honest workers there made 6 files in 60 steps) and a cheater there neither
    # cheats nor is judged
    links |= {f"cheater-{i}": LINKS[1 + i % (len(LINKS) - 1)] for i in range(a.cheaters)}
    # relays and the orchestrator (which serves the object store: every file crosses
    # its link three times) are rented servers on 1 Gbit/s; the trainer (origin) is on
    # 100 Mbit/s
    links |= {"relay": 1000, "trainer": 100, "orchestrator": 1000, "validator": 100}
    layout = Layout(links=links, cpus={"worker": a.worker_cpu, "cheater": a.worker_cpu},
                    weights=WEIGHTS, fanout=max(1, a.relays // (2 ** (a.levels - 1))),
                    levels=a.levels, paths=paths(a), blocks=blocks(a))  # fmt: skip
    return config, overrides, cfg, layout


def replan(a: argparse.Namespace) -> int:
    """With --replan: the planner's prediction (--costs) of the run already in --runs,
    beside its figures (swarm_scale.json), without running a swarm: a model or its
    costs checked again against saved runs."""
    if not a.costs:
        print("--replan and --predict need --costs", file=sys.stderr)
        return 2
    if a.predict:  # before the run: a prediction to commit, then to hold the run to
        _, _, cfg, layout = setup(a, ROOT / "models" / "tiny-reverse_text")
        flags = {k: v for k, v in vars(a).items() if k not in ("costs", "predict", "replan")}
        print(json.dumps({"flags": flags, "planned": planned(a, cfg, layout)[0]}))
        return 0
    saved = Path(a.runs) / "swarm" / "swarm_scale.json"
    out = json.loads(saved.read_text())
    _, _, cfg, layout = setup(a, ROOT / "models" / "tiny-reverse_text")
    print(
        json.dumps({"run": str(saved), "seed": out.get("seed"), **predicted(a, cfg, layout, out)})
    )
    return 0


def main() -> int:
    a = _args()
    if a.replan or a.predict:
        return replan(a)
    ok, why = netns.available()
    if ok and not a.clean_links:
        import importlib.util

        if importlib.util.find_spec("netfilterqueue") is None or not shutil.which("iptables"):
            ok, why = False, "delayed links need iptables and NetfilterQueue: make netqueue"
    if not ok:
        print(json.dumps({"skipped": why}))
        return 2
    from swarmrl.launch.swarm import launch
    from swarmrl.sim.emulated import Emulated

    tiny = ROOT / "models" / "tiny-reverse_text"
    if is_tiny(a) and not (tiny / "warm_start.json").exists():
        print(json.dumps({"skipped": f"no tiny model at {tiny}: make run-tiny builds it"}))
        return 2
    config, overrides, cfg, layout = setup(a, tiny)
    honest = a.workers
    url: list[str] = []
    t0 = time.monotonic()
    with netns.Network("scale") as net:
        net.attach_host()
        place = Emulated(net, layout)
        shutil.rmtree(cfg.run_dir, ignore_errors=True)  # the chaos reads its steps from it
        chaos = Chaos(net, cfg.run_dir, a, url)
        chaos.flag.unlink(missing_ok=True)
        chaos.hostile_flag.unlink(missing_ok=True)
        late = {f"worker-{i}" for i in range(honest - a.late, honest)}
        wrap = place.wrap

        def wrap_late(proc):  # late workers wait for the flag (step 2) before they start
            if proc.name in late:
                proc.argv = ["sh", "-c", f'while [ ! -e "{chaos.flag}" ]; do sleep 0.2; done;'
                             ' exec "$@"', "late", *proc.argv]  # fmt: skip
            if proc.name == chaos.hostile_name:  # once its flag is there, it comes back lying
                for attr in ("argv", "restart_argv"):
                    if getattr(proc, attr) is not None:
                        setattr(proc, attr, turns_hostile(getattr(proc, attr), chaos.hostile_flag))
            wrap(proc)

        place.wrap = wrap_late
        url.append(f"http://{place.host('orchestrator', '')}:8000")
        chaos.start()
        try:
            code = launch(cfg, config, overrides, resume=False, fresh=True, cheaters=a.cheaters,
                          cheats=a.cheats.split(","), place=place)  # fmt: skip
        finally:
            chaos.stop.set()
            chaos.join(10)
            ended = time.time()
            links_set = {n: net.impairment(node) for n, node in net.nodes.items()}
    wall = time.monotonic() - t0
    run = cfg.run_dir
    metrics = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x]
    names = {p.read_text().strip(): p.parent.name for p in (run / "nodes").glob("*/node.pub")}
    files, honest_states, staleness = records.file_fates(run, names, metrics)
    db = sqlite3.connect(run / "orchestrator" / "state.sqlite")
    ledger = dict(db.execute("SELECT key, state FROM nodes").fetchall())
    cheater_keys = [k for k, n in names.items() if n.startswith("cheater-")]
    lags, origin_mb, delivered_mb = records.lags(run / "logs", layout, a.relays)
    evals = json.loads((run / "eval.json").read_text()) if (run / "eval.json").exists() else {}
    busy = sum(m.get("train_s", 0.0) for m in metrics[1:])
    span = metrics[-1]["elapsed_s"] - metrics[0]["elapsed_s"] if len(metrics) > 1 else 0.0
    kinds = dict(zip([f"cheater-{j}" for j in range(a.cheaters)],
                     launch_cheats(a), strict=True))  # fmt: skip
    killed = {e["kill"] for e in chaos.events if e.get("why") == "churn"}
    classes = {n: f"{mbit:g} Mbit/s" for n, mbit in layout.links.items() if n.startswith("worker-")}
    cores = {n: a.worker_cpu for n in names.values()}
    joined = [e["time"] for e in chaos.events if "join" in e]  # the late workers' turn
    late = {n: joined[0] for n in chaos.late} if joined else {}
    opened = swarm_fates.fates(run, names, killed, classes, cores, ended, kinds, late)
    nets = dict(db.execute("SELECT key, net FROM nodes WHERE role = 'worker'").fetchall())
    blamed = db.execute("SELECT node, check_name FROM files WHERE state = 'rejected'").fetchall()
    out = {
        "exit_code": code,
        "seed": a.seed,
        "wall_s": round(wall, 1),
        "workers_max": honest + a.cheaters,
        "relays": a.relays,
        "tree_depth": a.levels,
        "validators": a.validators,
        "churn_events": len([e for e in chaos.events if "kill" in e]),
        "events": chaos.events,
        "link_mbit": sorted(set(layout.links.values())),
        "trusted_workers": sum(k in chaos.trusted for k in names),
        "address_ranges": len(set(nets.values())),
        "links": link_classes(links_set, layout),
        "delay_line": delay_summary(chaos.net.delay_stats()),
        "steps": len(metrics),
        "trainer_busy_fraction": round(busy / span, 3) if span else None,
        # lost from the workers' side (their files.jsonl); the ledger's and logs' view beside
        "files": files | {"lost": opened["lost"], "lost_ledger_view": files["lost"]},
        "honest_files_rejected": sum(
            names.get(n, "").startswith("worker-") and not swarm_fates.blameless(c)
            for n, c in blamed
        ),
        "honest_files_refused_blamelessly": sum(
            names.get(n, "").startswith("worker-") and swarm_fates.blameless(c) for n, c in blamed
        ),
        "cheaters": a.cheaters,
        "cheater_files_trained": {k: v["trained"] for k, v in opened["cheater_files"].items()},
        "honest_workers_without_accepted_file": len(opened["honest_workers_without_accepted_file"]),
        "honest_workers_without_trained_file": len(opened["honest_workers_without_trained_file"]),
        "first_accepted_file_s": opened["first_accepted_file_s"],
        "open_swarm": opened,
        "honest_waste_fraction": swarm_fates.honest_waste(opened),
        "files_per_core_s_by_link": {
            c.split()[0]: v["trained_per_core_s"] for c, v in opened["by_link_class"].items()
        },
        "publish": a.publish,
        "assign": cfg.orchestrator.assign,
        "cheaters_ejected": sum(ledger.get(k) in ("ejected", "banned") for k in cheater_keys),
        # a cheater that never got work (a slow link: its policy always a step behind,
        # orchestrator.work_slack_steps) made nothing to judge, and gained nothing
        "cheaters_given_work": sum(
            bool(db.execute("SELECT 1 FROM assignments WHERE node = ?", (k,)).fetchone())
            for k in cheater_keys
        ),
        "weights_lag_s": lags,
        "origin_bytes_out": int(origin_mb * 1e6),
        "bytes_delivered": int(delivered_mb * 1e6),
        "orchestrator_service_p99_ms": records.p99_ms(chaos.scrapes),
        "orchestrator_service_p99_ms_by_route": records.routes(chaos.scrapes),
        "orchestrator_request_p99_ms": records.p99_ms(chaos.scrapes, REQUEST),
        "orchestrator_request_p99_ms_by_route": records.routes(chaos.scrapes, REQUEST),
        "validator_backlog_max": records.backlog(chaos.scrapes),
        "cpu_s_by_role": records.cpu_by_role(chaos.cpu),
        "staleness_histogram": staleness,
        "heldout_accuracy": {
            "before": evals.get("start_model", {}).get("accuracy"),
            "after": evals.get("final_model", {}).get("accuracy"),
        },
        # greedy mean reward on the same problems (1 - normalised edit distance): on this
        # tiny model exact reversals move little in minutes (docs/results.md, the default run)
        "heldout_reward": {
            "before": evals.get("start_model", {}).get("mean_reward"),
            "after": evals.get("final_model", {}).get("mean_reward"),
        },
    }
    if a.costs:
        out["plan"] = predicted(a, cfg, layout, out)
    tl = records.timeline(run, chaos, layout)
    out["hostile_relay"] = hostile_figures(tl, chaos, db)
    (run / "timeline.json").write_text(json.dumps(tl))
    (run / "cpu.jsonl").write_text("".join(json.dumps(x) + "\n" for x in chaos.cpu_series))
    (run / "links.json").write_text(  # the planner's calibration reads both (plan/calibrate.py)
        json.dumps({n: layout.of(layout.links, n) for n in sorted(chaos.net.nodes)})
    )
    records.plot_timeline(tl, run / "timeline.png")
    if a.plot:
        shutil.copy(run / "timeline.png", a.plot)
    (run / "swarm_scale.json").write_text(json.dumps(out))
    print(json.dumps(out))
    return 0 if code == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
