"""`swarmrl orchestrator`: build the service from config (the one place where the
database engine and the object store are chosen) and serve it with uvicorn, under
the connection limits of orchestrator/connections.py."""

from __future__ import annotations

import logging
import os
import secrets
from pathlib import Path

from swarmrl.config import ConfigError, RunConfig
from swarmrl.orchestrator.admission import proof_bits
from swarmrl.orchestrator.db import open_database
from swarmrl.orchestrator.service import Service
from swarmrl.protocol.identity import parse_public_key

log = logging.getLogger("swarmrl.orchestrator")


def operator_token(cfg: RunConfig) -> str:
    """The operator's bearer token, created (mode 0600) on first use."""
    o = cfg.orchestrator
    path = (
        Path(o.operator_token_file)
        if o.operator_token_file
        else (cfg.paths.keys / "operator.token")
    )
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_urlsafe(32) + "\n")
    token = path.read_text().strip()
    if len(token) < 16:
        raise ConfigError(f"{path}: the operator token must be at least 16 characters")
    return token


def role_keys(cfg: RunConfig) -> tuple[frozenset[str], frozenset[str]]:
    keys_dir = cfg.paths.keys
    o = cfg.orchestrator
    trainers = list(o.trainer_keys) or [
        p.read_text().strip() for p in sorted(keys_dir.glob("trainer.pub"))
    ]
    validators = (
        list(o.validator_keys)
        or list(cfg.validator.public_keys)
        or [p.read_text().strip() for p in sorted(keys_dir.glob("validator-*.pub"))]
    )
    if not trainers:
        raise ConfigError(
            f"no trainer key: set orchestrator.trainer_keys or create {keys_dir}/trainer.pub"
        )
    for k in trainers + validators:
        parse_public_key(k)  # a malformed key is a config error that names it
    return frozenset(trainers), frozenset(validators)


def make_service(cfg: RunConfig, public_url: str) -> Service:
    from swarmrl.orchestrator.objects import LocalObjectStore, S3ObjectStore

    o = cfg.orchestrator
    paths = cfg.paths
    db = open_database(o.database, paths.orchestrator / "state.sqlite")
    trainers, validators = role_keys(cfg)
    svc = Service(
        cfg=cfg,
        db=db,
        trainer_keys=trainers,
        validator_keys=validators,
        operator_token=operator_token(cfg),
    )
    svc.init_identity()
    svc.work_bits = proof_bits(svc)
    if o.store == "s3":
        svc.objects = S3ObjectStore(o.s3_bucket, o.s3_endpoint, o.s3_region)
    else:
        root = Path(o.store_dir) if o.store_dir else paths.store
        svc.objects = LocalObjectStore(root, svc.secret, public_url)
    if cfg.task.name == "verifiers":
        _pin_taskset(svc)
    if cfg.task.reward:
        _pin_reward(svc)
    return svc


def _pin_reward(svc: Service) -> None:
    """The reward function every node must run: the operator's task.reward_fingerprint,
    else this machine's, once the function is imported and probed here
    (tasks/graders/custom.py), written into the run config the orchestrator serves."""
    from swarmrl.tasks.graders.custom import load_reward
    from swarmrl.tasks.sources.task_source import TaskSource

    task = svc.cfg.task
    if not task.reward_fingerprint:
        reward = load_reward(task.reward, TaskSource(task, svc.cfg.seed))
        reward.close()
        task = task.model_copy(update={"reward_fingerprint": reward.fingerprint})
        svc.cfg = svc.cfg.model_copy(update={"task": task})
    log.info("every node grades with %s (task.reward_fingerprint)", task.reward_fingerprint)


def _pin_taskset(svc: Service) -> None:
    """The verifiers taskset every node must run: the operator's task.env_fingerprint,
    else this machine's (tasks/sources/environments.py: `fingerprint`); refused when
    neither can be had."""
    import json

    from swarmrl.tasks.sources.environments import fingerprint

    task = svc.cfg.task
    if task.env_fingerprint:
        log.info("every node runs the taskset %s (task.env_fingerprint)", task.env_fingerprint)
        return
    try:
        svc.taskset_pin = fingerprint(task.env, json.dumps(task.env_args, sort_keys=True))
    except Exception as e:  # fails closed: no run whose nodes cannot be compared
        raise ConfigError(
            f"the orchestrator of a verifiers run pins the taskset every node runs, and "
            f"cannot load '{task.env}' here ({e}): install it beside the orchestrator, or "
            "set task.env_fingerprint to the fingerprint the nodes must have"
        ) from None
    log.info("every node runs the taskset %s (task.env_fingerprint)", svc.taskset_pin)


def run_orchestrator(cfg: RunConfig) -> None:
    import uvicorn

    from swarmrl.orchestrator.app import build_app
    from swarmrl.orchestrator.connections import ConnectionLimits, server_config
    from swarmrl.orchestrator.nodes import revive_after_restart

    o = cfg.orchestrator
    url = o.url or f"http://{o.host}:{o.port}"
    svc = make_service(cfg, url)
    revive_after_restart(svc)
    app = build_app(svc, sweep_every_s=min(1.0, o.heartbeat_s / 2))
    log.info("orchestrator of run %s (%s) at %s", svc.run_id, svc.db.engine, url)
    env = cfg.env
    if env.kind != "none" and "python" in env.tools:  # what public_params serves
        from swarmrl.envs.python_tool import interpreter_version

        pinned = env.python_version or interpreter_version()
        log.info("the Python tool runs on Python %s on every node (env.python_version)", pinned)
    limits = ConnectionLimits.from_config(o)
    uvicorn.Server(
        server_config(app, o.host, o.port, limits, log_level="warning", access_log=False)
    ).run()
