"""The `swarmrl` command: one subcommand per role.

`_parser` declares every command and flag in one list, so `swarmrl --help`
and this file read the same. `COMMANDS` maps each command to a short handler
that loads the config, imports what the command needs (torch only there, so
`--help` stays fast) and calls into the package; what a command computes
lives beside the code it belongs to, not here.

Settings have one spelling, the run config's: `--config FILE` and dotted
overrides (`seed=1`, `task.name=addition`). The few flags that name a run setting
(`SETTING_FLAGS`: init-model's `--task` and `--seed`, eval's `--task` and
`--digits`) are shorthands for its override; given both ways with different
values, the command refuses. Flags only tests and demos use (`--cheat`,
`--cheaters`, `--cheats`, `--fail-in-sync`) work but are left out of `--help`.
`rl`, `eval` and `worker` are thin calls into the Python API (api.py).

Errors: `main` catches one base, `UserError` (bad input or a refusal the user
can fix), prints `swarmrl: <message>` to stderr without a traceback and exits
with the error's `exit_code`. Two commands keep their own message: `filter`
prefixes `swarmrl filter:`, and a refused `worker` logs the refusal and exits
3. Every other exception is a bug and keeps its traceback.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path

from swarmrl import __version__
from swarmrl.errors import EXIT_USAGE, UserError

INIT_MODEL_TASKS = ("reverse_text", "addition")  # the tasks init-model warm-starts on
# Flags that spell a run setting, per command: `--task X` is `task.name=X`.
SETTING_FLAGS = {
    "init-model": {"task": "task.name", "seed": "seed"},
    "eval": {"task": "task.name", "digits": "task.digits"},
}


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", help="TOML run configuration (defaults when omitted)")
    p.add_argument("overrides", nargs="*", help="dotted overrides, e.g. trainer.lr=3e-4")


def _fresh_or_resume(p: argparse.ArgumentParser, fresh: str, resume: str) -> None:
    g = p.add_mutually_exclusive_group()
    g.add_argument("--resume", action="store_true", help=resume)
    g.add_argument("--fresh", action="store_true", help=fresh)


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="swarmrl", description="Decentralized asynchronous RL for language models."
    )
    ap.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = ap.add_subparsers(dest="command", required=True)
    p = sub.add_parser("rl", help="run the whole swarm locally (trainer, relays, workers)")
    _common(p)
    _fresh_or_resume(
        p, fresh="delete an existing run directory of this name first",
        resume="continue from the newest complete version",
    )  # fmt: skip
    # demos and tests, hidden from --help: N dishonest workers (validator demo), and the
    # comma-separated cheats they get in turn (default: sim/registry.py's RL_CHEATS)
    p.add_argument("--cheaters", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--cheats", default=None, help=argparse.SUPPRESS)
    p = sub.add_parser("trainer", help="run the GRPO trainer process")
    _common(p)
    p.add_argument("--resume", action="store_true")
    p = sub.add_parser("worker", help="join a run as an inference worker (needs only its URL)")
    p.add_argument("--orchestrator", required=True, help="URL of the run's orchestrator")
    p.add_argument(
        "--home", default="swarmrl-worker", help="this node's directory: key, weights, logs"
    )
    p.add_argument("--threads", type=int, default=1, help="torch threads")
    p.add_argument("--device", default="auto", help="where to generate: auto (a CUDA GPU if "
                   "torch sees one, else the CPU), cpu, cuda or cuda:N")  # fmt: skip
    p.add_argument("--invite", default=os.environ.get("SWARMRL_INVITE", ""),
                   help="an invitation from the run's operator (POST /v1/admin/invites; default "
                   "$SWARMRL_INVITE): joins without proof of work or waiting for the faucet",
    )  # fmt: skip
    # tests and demos, hidden from --help: run as a dishonest worker of this kind
    p.add_argument("--cheat", default=None, help=argparse.SUPPRESS)
    p.add_argument("--backend", choices=["auto", "hf", "vllm"], default=None,
                   help="generation engine (default: the run's inference.backend)")  # fmt: skip
    p = sub.add_parser("orchestrator", help="run the orchestrator service of a run")
    _common(p)
    p = sub.add_parser(
        "keygen", help="create an ed25519 key file (mode 0600) and print its public key"
    )
    p.add_argument("--out", required=True, help="key file to create (its .pub goes beside it)")
    p = sub.add_parser("status", help="print a run's nodes, states, contributions and stakes")
    p.add_argument("--orchestrator", required=True, help="URL of the run's orchestrator")
    p.add_argument("--json", action="store_true", help="print the ledger as JSON")
    p = sub.add_parser("validator", help="run a validator: check rollout files, write verdicts")
    _common(p)
    p.add_argument("--index", type=int, default=0, help="validator number (of validator.count)")
    p = sub.add_parser("relay", help="run a SHARDCAST relay (mirrors weights, serves them onward)")
    _common(p)
    p.add_argument(
        "--upstream", required=True, help="comma-separated URLs of the origin or other relays"
    )
    p.add_argument("--dir", required=True, help="directory the relay keeps versions in")
    p.add_argument("--port", type=int, default=0, help="port to listen on (0: any free port)")
    p.add_argument("--host", default=None, help="address to listen on (default shardcast.host)")
    p.add_argument("--public-url", default=None,
                   help="URL nodes reach this relay at, registered with the orchestrator "
                   "(default http://HOST:PORT; required with --port 0 or a wildcard host)",
    )  # fmt: skip
    p.add_argument("--inner", action="store_true",
                   help="a relay of a tree's inner level, serving only other relays: it does not "
                   "register with the orchestrator, so workers are not sent to it",
    )  # fmt: skip
    p = sub.add_parser("origin", help="serve a weights directory as a SHARDCAST origin")
    _common(p)
    p.add_argument("--dir", required=True, help="weights directory (step_NNNNNN/ versions)")
    p.add_argument("--port", type=int, default=0, help="port to listen on (0: any free port)")
    p.add_argument("--host", default=None, help="address to listen on (default shardcast.host)")
    p = sub.add_parser("fetch", help="download one policy version through SHARDCAST and exit")
    _common(p)
    p.add_argument("--servers", required=True, help="comma-separated relay or origin URLs")
    p.add_argument("--dir", required=True, help="directory to put step_NNNNNN/ into")
    p.add_argument("--min-version", type=int, default=0, help="wait for at least this version")
    p.add_argument("--timeout", type=float, default=None, help="give up after this many seconds")
    p = sub.add_parser("init-model", help="build and warm-start the tiny built-in model")
    p.add_argument(
        "--task", default=None, choices=INIT_MODEL_TASKS,
        help="the task to warm-start on: task.name=TASK (default: the config's task)",
    )  # fmt: skip
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument(
        "--target", type=float, default=0.30,
        help="centre of the band of sampled reward (at the run's temperature) to stop in",
    )  # fmt: skip
    p.add_argument("--tolerance", type=float, default=0.05, help="half-width of that band")
    p.add_argument("--max-steps", type=int, default=3000, help="warm-start steps at most")
    p.add_argument("--lr", type=float, default=2e-3, help="warm-start learning rate (AdamW)")
    p.add_argument("--threads", type=int, default=min(2, os.cpu_count() or 1), help="torch threads")
    p.add_argument(
        "--config",
        help="take the task and sampling settings (lengths, temperature) from this run config",
    )
    p.add_argument(
        "overrides", nargs="*", help="dotted overrides of that config, e.g. task.max_len=6"
    )
    p.add_argument("--seed", type=int, default=None, help="seed=N (default: the config's seed)")
    p = sub.add_parser("eval", help="greedy accuracy and mean reward on held-out problems")
    p.add_argument("--model", required=True, help="HF directory, .gguf file, or 'smollm2'")
    p.add_argument("--task", default=None,
                   help="task.name=TASK (default: the config's task, else reverse_text)")  # fmt: skip
    p.add_argument("--n", type=int, default=200)
    p.add_argument("--digits", type=int, default=None, help="task.digits=D: digits per operand")
    p.add_argument("--target-length", type=int, default=0,
                   help="thinking budget T in tokens: prompts carry the budget instruction and "
                   "the report says how closely lengths follow it (max new tokens default 2T)",
    )  # fmt: skip
    p.add_argument("--max-new-tokens", type=int, default=None)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument(
        "--level", type=int, default=0, help="difficulty level of generated tasks (0: the start)"
    )
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.add_argument("--config", help="take the task settings (lengths) from this run config")
    p.add_argument("overrides", nargs="*", help="dotted overrides of that config")
    p = sub.add_parser(
        "filter", help="keep the tasks of a file whose solve rate by a model is in a range"
    )
    p.add_argument("--model", required=True, help="HF directory, .gguf file, or 'smollm2'")
    p.add_argument("--data", required=True, help="task file: .jsonl, .parquet or datasets dir")
    p.add_argument("--out", required=True, help="JSONL of kept tasks (resumed if it exists)")
    p.add_argument("--samples", type=int, default=8, help="completions sampled per task")
    p.add_argument("--max-solve-rate", type=float, default=0.75)
    p.add_argument("--min-solve-rate", type=float, default=0.0)
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=2)
    p = sub.add_parser(
        "diloco", help="pre-train a tiny model with DiLoCo across local sites (torchft)"
    )
    _common(p)
    _fresh_or_resume(
        p, fresh="replace an existing run of this name",
        resume="each site goes on from its newest checkpoint",
    )  # fmt: skip
    p = sub.add_parser("diloco-site", help="run one DiLoCo site (joins through the lighthouse)")
    _common(p)
    p.add_argument("--site", type=int, required=True, help="site index (picks the data shard)")
    p.add_argument("--lighthouse", required=True, help="URL of the torchft lighthouse")
    p.add_argument("--resume", action="store_true", help="go on from this site's newest checkpoint")
    # fault injection for tests, hidden from --help: exit half-way through the
    # all-reduce of this outer step
    p.add_argument("--fail-in-sync", type=int, default=0, help=argparse.SUPPRESS)
    from swarmrl.plan import cli as plan_cli

    plan_cli.add_parser(sub)
    sub.add_parser("config-docs", help="print the configuration reference (docs/config.md)")
    sub.add_parser("openapi", help="print the orchestrator's OpenAPI document (docs/openapi.json)")
    return ap


def _setup_logging() -> None:
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")  # fmt: skip
    logging.getLogger("httpx").setLevel(logging.WARNING)  # a line per request drowns the log


def setting_overrides(args: argparse.Namespace) -> list[str]:
    """The command's dotted overrides with its `SETTING_FLAGS` written as overrides too;
    a setting given both ways with different values is refused."""
    from swarmrl.config import parse_override

    out = list(args.overrides)
    for dest, key in SETTING_FLAGS.get(args.command, {}).items():
        value = getattr(args, dest)
        if value is None:
            continue
        flag = "--" + dest.replace("_", "-")
        for item in args.overrides:
            path, given = parse_override(item)
            if ".".join(path) == key and given != value:
                raise UserError(f"{flag} {value} and {item} disagree: give {key} once")
        out.append(f"{key}={json.dumps(value)}")
    return out


def _run_config(args: argparse.Namespace):
    from swarmrl.config import load_config

    return load_config(args.config, setting_overrides(args))


def _csv(text: str) -> list[str]:
    """The items of a comma-separated flag (URLs, cheats)."""
    return [u.strip() for u in text.split(",") if u.strip()]


def _config_docs(args: argparse.Namespace) -> int:
    from swarmrl.apps.config_docs import config_docs

    print(config_docs())
    return 0


def _init_model(args: argparse.Namespace) -> int:
    _setup_logging()
    from swarmrl.apps.init_model import BAND_ARGS_ERROR, band_args_ok, init_model, summary_line
    from swarmrl.apps.warm_start import Band

    if not band_args_ok(args.target, args.tolerance):
        print(BAND_ARGS_ERROR)
        return EXIT_USAGE
    cfg = _run_config(args)
    if cfg.task.name not in INIT_MODEL_TASKS:
        raise UserError(
            f"init-model warm-starts on {' or '.join(INIT_MODEL_TASKS)}, not task.name = "
            f"{cfg.task.name!r}: pass --task"
        )
    res = init_model(
        cfg.task, cfg.sampling, args.out, band=Band(args.target, args.tolerance),
        max_steps=args.max_steps, lr=args.lr, seed=cfg.seed, threads=args.threads,
    )  # fmt: skip
    print(summary_line(args.out, res))
    return 0 if res.in_band else 1


def _eval(args: argparse.Namespace) -> int:
    from swarmrl import api
    from swarmrl.apps.evaluate import text_report

    res = api.evaluate(
        args.model, args.config, setting_overrides(args), n=args.n, level=args.level,
        target_length=args.target_length, max_new_tokens=args.max_new_tokens,
        threads=args.threads,
    )  # fmt: skip
    print(json.dumps(res) if args.json else text_report(res))
    return 0


def _filter(args: argparse.Namespace) -> int:
    from swarmrl.apps.filter import FilterError, run_filter

    try:
        res = run_filter(
            args.model, Path(args.data), Path(args.out), args.samples,
            args.max_solve_rate, args.min_solve_rate, args.max_new_tokens,
            args.temperature, args.top_p, args.seed, args.threads,
            show_progress=sys.stderr.isatty(),
        )  # fmt: skip
    except FilterError as e:  # the filter's own prefix; other user errors reach main
        print(f"swarmrl filter: {e}", file=sys.stderr)
        return e.exit_code
    print(json.dumps(res))
    return 0


def _openapi(args: argparse.Namespace) -> int:
    from swarmrl.orchestrator.app import openapi_spec

    print(json.dumps(openapi_spec(), indent=1, sort_keys=True))
    return 0


def _keygen(args: argparse.Namespace) -> int:
    from swarmrl.protocol.identity import load_or_create_key, public_key_hex

    out = Path(args.out)
    if out.exists():
        raise UserError(f"{out} exists; not overwriting a key")
    print(public_key_hex(load_or_create_key(out)))
    return 0


def _status(args: argparse.Namespace) -> int:
    from swarmrl.protocol.status import print_status

    return print_status(args.orchestrator, args.json)


def _worker(args: argparse.Namespace) -> int:
    from swarmrl import api
    from swarmrl.inference.worker import NodeRefused

    _setup_logging()
    try:
        api.join(
            args.orchestrator, args.home, threads=args.threads, device=args.device,
            backend=args.backend, invite=args.invite, cheat=args.cheat,
        )  # fmt: skip
    except NodeRefused as e:  # said in the worker's log, which the launcher shows
        logging.getLogger("swarmrl.worker").error("the orchestrator refuses this node: %s", e)
        return e.exit_code
    return 0


def _pretrain_config(args: argparse.Namespace):
    from swarmrl.config import load_config
    from swarmrl.config.pretrain import PretrainConfig

    return load_config(args.config, args.overrides, schema=PretrainConfig)


def _diloco(args: argparse.Namespace) -> int:
    pcfg = _pretrain_config(args)
    from swarmrl.launch.diloco import run_diloco

    return run_diloco(pcfg, args.config, args.overrides, args.fresh, args.resume)


def _diloco_site(args: argparse.Namespace) -> int:
    pcfg = _pretrain_config(args)
    _setup_logging()
    from swarmrl.apps.pretrain.site import run_site

    run = Path(pcfg.runs_dir) / pcfg.name
    run.mkdir(parents=True, exist_ok=True)
    return run_site(pcfg, run, args.site, args.lighthouse, args.fail_in_sync, args.resume)


def _rl(args: argparse.Namespace) -> int:
    from swarmrl import api

    result = api.run_swarm(
        args.config, args.overrides, fresh=args.fresh, resume=args.resume,
        cheaters=args.cheaters, cheats=_csv(args.cheats) if args.cheats else None,
    )  # fmt: skip
    return result.exit_code


def _trainer(args: argparse.Namespace) -> int:
    cfg = _run_config(args)
    _setup_logging()
    from swarmrl.trainer.fsdp import exit_after_leaving
    from swarmrl.trainer.loop import run_trainer

    run_trainer(cfg, resume=args.resume)
    if cfg.trainer.ranks > 1:  # every rank has left its group: skip gloo's teardown
        exit_after_leaving(0)
    return 0


def _orchestrator(args: argparse.Namespace) -> int:
    cfg = _run_config(args)
    _setup_logging()
    from swarmrl.orchestrator.server import run_orchestrator

    run_orchestrator(cfg)
    return 0


def _validator(args: argparse.Namespace) -> int:
    cfg = _run_config(args)
    _setup_logging()
    from swarmrl.validator.loop import run_validator

    run_validator(cfg, args.index)
    return 0


def _relay(args: argparse.Namespace) -> int:
    cfg = _run_config(args)
    _setup_logging()
    from swarmrl.shardcast.relay import join_orchestrator, relay_public_url, run_relay
    from swarmrl.shardcast.source import trainer_public_key

    sc = cfg.shardcast
    host = args.host or sc.host
    if cfg.orchestrator.url and not args.inner:
        public = relay_public_url(host, args.port, args.public_url)
        join_orchestrator(cfg.orchestrator.url, Path(args.dir) / "node.key", public)
    run_relay(
        _csv(args.upstream), trainer_public_key(cfg), Path(args.dir), host=host,
        port=args.port, keep=cfg.async_level + 1, parallel=sc.parallel,
        max_bytes_per_s=sc.max_upload_mbps * 1e6, poll_wait_s=sc.poll_wait_s,
    )  # fmt: skip
    return 0


def _fetch(args: argparse.Namespace) -> int:
    cfg = _run_config(args)
    _setup_logging()
    import asyncio

    from swarmrl.shardcast.fetch import fetch_once, fetch_report
    from swarmrl.shardcast.source import trainer_public_key

    sc = cfg.shardcast
    got = asyncio.run(
        fetch_once(
            _csv(args.servers), trainer_public_key(cfg), Path(args.dir), args.min_version,
            sc.parallel, args.timeout, sc.direct_io,
        )
    )  # fmt: skip
    print(json.dumps(fetch_report(got)), flush=True)
    return 0


def _origin(args: argparse.Namespace) -> int:
    cfg = _run_config(args)
    _setup_logging()
    from swarmrl.shardcast.origin import serve_directory

    sc = cfg.shardcast
    serve_directory(Path(args.dir), args.host or sc.host, args.port, sc.max_upload_mbps * 1e6)
    return 0


def _plan(args: argparse.Namespace) -> int:
    from swarmrl.plan.cli import run

    return run(args)


COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "rl": _rl,
    "trainer": _trainer,
    "worker": _worker,
    "orchestrator": _orchestrator,
    "keygen": _keygen,
    "status": _status,
    "validator": _validator,
    "relay": _relay,
    "origin": _origin,
    "fetch": _fetch,
    "init-model": _init_model,
    "eval": _eval,
    "filter": _filter,
    "diloco": _diloco,
    "diloco-site": _diloco_site,
    "plan": _plan,
    "config-docs": _config_docs,
    "openapi": _openapi,
}


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        return COMMANDS[args.command](args)
    except UserError as e:  # bad input or a refusal: the message, no traceback
        print(f"swarmrl: {e}", file=sys.stderr)
        return e.exit_code


if __name__ == "__main__":
    sys.exit(main())
