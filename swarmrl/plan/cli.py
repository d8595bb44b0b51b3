"""`swarmrl plan`: what a swarm of a given shape would do, from measured costs.

    swarmrl plan --calibrate --save-costs costs.json     # measure this machine's costs
    swarmrl plan --from-run RUNS/swarm --worker-cores 0.25 --save-costs costs.json
    swarmrl plan --costs costs.json --workers 100 --links 100,1000 --relays 4,16
    swarmrl plan --project docs/plan                      # INTELLECT-2-like runs: table, figure

The costs come from `--costs` (a JSON file `--save-costs` wrote), `--from-run` (a
finished run's records; an emulated swarm's, bench/swarm_scale.py, gives them
under load: plan/under_load.py) or `--calibrate` (a short run here first); the
swarm's shape from the flags. It prints the model's outcome (plan/model.py) as JSON.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

from swarmrl.errors import UserError


def add_parser(sub) -> None:
    p = sub.add_parser("plan", help="capacity planner: a swarm's throughput, lag and staleness")
    src = p.add_argument_group("costs (one of)")
    src.add_argument("--costs", help="JSON costs file (written by --save-costs)")
    src.add_argument("--from-run", help="read the costs from a finished run's directory "
                     "(an emulated swarm's: under load)")  # fmt: skip
    src.add_argument("--calibrate", nargs="?", const="configs/tiny.toml", metavar="CONFIG",
                     help="measure them with a short run of CONFIG here (default tiny)")  # fmt: skip
    p.add_argument("--save-costs", help="write the costs used to this JSON file")
    p.add_argument("--worker-cores", type=float, default=1.0,
                   help="with --from-run: the cores each worker had (its share)")  # fmt: skip
    p.add_argument("--workers", type=int, default=32)
    p.add_argument("--links", default="10,50,100", help="workers' Mbit/s, given in turn")
    p.add_argument("--speeds", default="1", help="workers' speeds (x the costs' device), in turn")
    p.add_argument("--relays", default="1,2", help="relays per tree level, e.g. 4,16")
    p.add_argument("--relay-mbit", type=float, default=100.0)
    p.add_argument("--origin-mbit", type=float, default=100.0)
    p.add_argument("--validators", type=int, default=2)
    p.add_argument("--sample-rate", type=float, default=1.0)
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--batch-groups", type=int, default=16)
    p.add_argument("--groups-per-file", type=int, default=2,
                   help="groups in a file (--calibrate measures files of this size)")  # fmt: skip
    p.add_argument("--async-level", type=int, default=2)
    p.add_argument("--max-pending-groups", type=int, default=0, help="0: batch groups")
    p.add_argument("--version-mb", type=float, help="override the costs' version size")
    p.add_argument("--project", metavar="DIR",
                   help="INTELLECT-2-like projections (plan/project.py): table and figure in DIR")  # fmt: skip


def _floats(text: str, flag: str) -> list[float]:
    try:
        values = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise UserError(f"{flag} {text!r}: expected numbers separated by commas") from None
    if not values or any(v <= 0 for v in values):
        raise UserError(f"{flag} {text!r}: expected positive numbers")
    return values


def costs_of(args: argparse.Namespace):
    from swarmrl.plan import calibrate
    from swarmrl.plan.model import Costs

    given = [x for x in (args.costs, args.from_run, args.calibrate) if x]
    if len(given) != 1:
        raise UserError("swarmrl plan: give one of --costs, --from-run and --calibrate")
    try:
        if args.costs:
            costs = Costs(**json.loads(Path(args.costs).read_text()))
        elif args.from_run:
            costs = calibrate.from_run(Path(args.from_run), args.worker_cores)
        else:
            print(f"swarmrl plan: calibrating with a short run of {args.calibrate} ...",
                  file=sys.stderr)  # fmt: skip
            costs = calibrate.measure(args.calibrate, groups_per_file=args.groups_per_file)
    except (OSError, ValueError, TypeError, RuntimeError) as e:
        raise UserError(f"swarmrl plan: {e}") from None
    if args.version_mb:
        costs = dataclasses.replace(costs, version_mb=args.version_mb)
    if args.save_costs:
        Path(args.save_costs).write_text(json.dumps(dataclasses.asdict(costs), indent=1) + "\n")
    return costs


def run(args: argparse.Namespace) -> int:
    from swarmrl.plan.model import Swarm, Workers, simulate

    if args.project:
        from swarmrl.plan import project

        rows = project.write(Path(args.project))
        print(json.dumps(rows[-1]))
        return 0
    costs = costs_of(args)
    links = _floats(args.links, "--links")
    speeds = _floats(args.speeds, "--speeds")
    relays = [int(x) for x in _floats(args.relays, "--relays")]
    kinds: dict[tuple[float, float], int] = {}
    for i in range(args.workers):
        kind = (links[i % len(links)], speeds[i % len(speeds)])
        kinds[kind] = kinds.get(kind, 0) + 1
    swarm = Swarm(
        workers=[Workers(n, mbit, speed=s) for (mbit, s), n in kinds.items()],
        steps=args.steps, batch_groups=args.batch_groups, groups_per_file=args.groups_per_file,
        async_level=args.async_level, max_pending_groups=args.max_pending_groups,
        relays=relays, relay_mbit=args.relay_mbit, origin_mbit=args.origin_mbit,
        validators=args.validators, sample_rate=args.sample_rate,
    )  # fmt: skip
    out = simulate(swarm, costs).as_dict()
    print(json.dumps({"costs": dataclasses.asdict(costs), "outcome": out}))
    return 0
