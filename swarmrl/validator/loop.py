"""The validator process (`swarmrl validator`).

Forever, until the orchestrator reports the run done: claim the next pending
file (`POST /v1/validation/claim`; the orchestrator holds it for this
validator for `orchestrator.validation_lease_s`, then gives it to another if
no verdict came), download it through its signed URL, judge it
(validator/checks.py) against the assignment the orchestrator issued (seed,
sampler state, length budget) with the claimed policy version loaded
(mirrored through the weights seam, SHARDCAST when enabled, every version in
order), and post the signed verdict (`POST /v1/validation/verdict`). A line
per verdict goes to runs/<name>/verdicts.jsonl, this validator's own log.

Replays (the same bytes again, a second file for one assignment) never reach
a validator: the orchestrator issues the counters and refuses a second grant
for an assignment or a second submission of the same sha256.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from collections.abc import Callable
from pathlib import Path

from swarmrl.config import RunConfig
from swarmrl.device import describe, resolve_device
from swarmrl.envs.environment import environment_of
from swarmrl.envs.python_tool import check_interpreter
from swarmrl.inference.engine import PrefillEngine, make_engine
from swarmrl.inference.trajectory import check_turns
from swarmrl.models.loading import load_tokenizer
from swarmrl.protocol.assign import parse_rollout_key
from swarmrl.protocol.client import OrchestratorClient, OrchestratorError
from swarmrl.protocol.identity import load_or_create_key
from swarmrl.protocol.rollouts import sha256
from swarmrl.protocol.verdict import Verdict
from swarmrl.shardcast.adapter import model_dir
from swarmrl.shardcast.seed import expect_seed, seed_version_0
from swarmrl.shardcast.source import open_weights_source
from swarmrl.tasks.graders.custom import check_pin, reward_fingerprint
from swarmrl.tasks.grading import configure as configure_verifiers
from swarmrl.tasks.sources.task_source import TaskSource
from swarmrl.toploc.proof import Thresholds
from swarmrl.validator.calibrate import Calibration, calibrate
from swarmrl.validator.checks import (
    Context,
    Reject,
    check_with_model,
    check_without_model,
)
from swarmrl.validator.version_check import check_version

log = logging.getLogger("swarmrl.validator")
# Defaults by the dtype a version runs in; see validator/checks.py, check 8, and the
# honest spreads measured by bench/bf16_tolerances.py (docs/results.md).
LOGPROB_TOLERANCE = {"float32": 2e-5, "bfloat16": 0.1}
SAMPLING_TOLERANCE = {"float32": 0.01, "bfloat16": 1.0}
SAMPLING_MEAN_TOLERANCE = {"float32": 0.01, "bfloat16": 0.005}
OLDER_ENGINES = 2  # engines holding versions before the claimed one (check 9)


def logprob_tolerance(cfg: RunConfig, dtype: str) -> float:
    """`validator.logprob_tolerance`, or the default of the dtype the policy runs in."""
    given = cfg.validator.logprob_tolerance
    return given if given is not None else LOGPROB_TOLERANCE[dtype]


def sampling_tolerance(cfg: RunConfig, dtype: str) -> float:
    """`validator.sampling_tolerance`, or the default of the dtype the policy runs in."""
    given = cfg.validator.sampling_tolerance
    return given if given is not None else SAMPLING_TOLERANCE[dtype]


def sampling_mean_tolerance(cfg: RunConfig, dtype: str) -> float:
    """`validator.sampling_mean_tolerance`, or the default of the dtype the policy runs in."""
    given = cfg.validator.sampling_mean_tolerance
    return given if given is not None else SAMPLING_MEAN_TOLERANCE[dtype]


def make_context(cfg: RunConfig, tokenizer, backend) -> Context:
    v = cfg.validator
    return Context(
        cfg=cfg,
        tokenizer=tokenizer,
        source=TaskSource(cfg.task, cfg.seed),
        thresholds=Thresholds(v.max_exp_mismatches, v.max_mantissa_mean, v.max_mantissa_median),
        sampling_tolerance=sampling_tolerance(cfg, backend.running_dtype or "float32"),
        logprob_tolerance=logprob_tolerance(cfg, backend.running_dtype or "float32"),
        sampling_mean_tolerance=sampling_mean_tolerance(cfg, backend.running_dtype or "float32"),
        eos_id=backend.eos_id,
        vocab=backend.model.config.vocab_size,
        hidden_size=backend.model.config.hidden_size,
        max_batch_tokens=v.max_batch_tokens,
    )


class Judge:
    """Judges files for one validator: the checks, the ledger and the loaded policy.
    `make_engine`: builds another engine like `backend`, for the versions before the
    claimed one (check 9, `validator.version_check`); None: that check is off."""

    def __init__(
        self,
        cfg: RunConfig,
        backend: PrefillEngine,
        weights,
        key,
        make_engine: Callable[[], PrefillEngine] | None = None,
    ):
        self.cfg = cfg
        self.backend = backend
        self.weights = weights
        self.key = key
        self.make_engine = make_engine if cfg.validator.version_check else None
        per_file = cfg.worker.group_size * cfg.worker.groups_per_file
        if self.make_engine and per_file < cfg.validator.version_check_min_samples:
            log.warning(
                "files of this run hold %d samples, under validator.version_check_min_samples "
                "(%d): the version check compares only their token choices, not their "
                "log-probs", per_file, cfg.validator.version_check_min_samples,
            )  # fmt: skip
        # version -> an engine holding it, for check 9 (at most OLDER_ENGINES)
        self.older: dict[int, PrefillEngine] = {}
        self.ctx = make_context(cfg, load_tokenizer(cfg.model.path), backend)
        check_turns(environment_of(cfg), self.ctx.tokenizer, self.ctx.eos_id)
        self.loaded: int | None = None
        self.calibrations: dict[str, Calibration | None] = {}  # by dtype

    def ensure_policy(self, version: int) -> bool:
        """Load `version`; False when this validator does not hold it (yet)."""
        if self.loaded == version:
            return True
        newest = self.weights.newest()
        if newest is None or newest < version:
            return False
        if version in self.older and self.loaded is not None:
            # an engine holds it already (a version check loaded it): it takes the
            # claimed version's place, and the engine it replaces holds its version
            self.older[self.loaded], self.backend = self.backend, self.older.pop(version)
            self.loaded = version
            self.set_tolerances()
            return True
        try:
            self.backend.load(model_dir(self.weights, version))
        except FileNotFoundError:  # not mirrored (yet), or retention removed it
            return False
        self.loaded = version
        self.set_tolerances()
        return True

    def older_engine(self, version: int) -> PrefillEngine | None:
        """An engine holding `version` (check 9), or None when the check is off, there is
        no such version or it is not held here (any more). Of the engines it keeps, the
        one holding the oldest version is reloaded first."""
        if self.make_engine is None or version < 0:
            return None
        if version in self.older:
            return self.older[version]
        if len(self.older) < OLDER_ENGINES:
            engine = self.make_engine()
        else:
            engine = self.older.pop(min(self.older))
        try:
            engine.load(model_dir(self.weights, version))
        except Exception as e:  # not held (retention) or unreadable here: checks 1-8 stand
            log.info("version %d is not at hand for the version check: %s", version, e)
            self.older[-1 - len(self.older)] = engine  # kept, holding nothing usable
            return None
        self.older[version] = engine
        return engine

    def set_tolerances(self) -> None:
        """The sampling check's tolerances for the dtype the loaded version runs in (the
        trainer's publish dtype): measured by this validator once per dtype
        (validator/calibrate.py) unless `[validator]` sets them or `calibrate` is off."""
        dtype = self.backend.running_dtype or "float32"
        v = self.cfg.validator
        tol = {
            "logprob": logprob_tolerance(self.cfg, dtype),
            "sampling": sampling_tolerance(self.cfg, dtype),
            "sampling_mean": sampling_mean_tolerance(self.cfg, dtype),
        }
        if v.calibrate and dtype not in self.calibrations:
            try:
                self.calibrations[dtype] = calibrate(self.ctx, self.backend, tol)
            except Exception as e:  # the defaults stay; a warning, never a crash
                log.warning("calibration in %s failed, the defaults stay: %s", dtype, e)
                self.calibrations[dtype] = None
            if self.calibrations[dtype] is not None:
                log.info(self.calibrations[dtype].line())
        cal = self.calibrations.get(dtype)
        given = {"logprob": v.logprob_tolerance, "sampling": v.sampling_tolerance,
                 "sampling_mean": v.sampling_mean_tolerance}  # fmt: skip
        if cal is not None:
            tol = {k: t if given[k] is not None else cal.tolerances[k] for k, t in tol.items()}
        self.ctx = dataclasses.replace(
            self.ctx,
            logprob_tolerance=tol["logprob"],
            sampling_tolerance=tol["sampling"],
            sampling_mean_tolerance=tol["sampling_mean"],
            logprob_noise=cal.noise if cal is not None and given["logprob"] is None else None,
        )

    def check_versions(
        self, ctx: Context, policy: int, rows: list[dict], errors, behind=None
    ) -> dict:
        """Check 9 against the version before `policy`, and, when that one explains the
        file at least as well as the claimed one (its error ratio under 1, or more of
        the file's tokens following it than the claimed one), against the one before it
        too: a file made two versions back sits between them. `errors` and `behind`:
        check 8's figures of each sample under the claimed version."""
        vc = self.cfg.validator
        stats: dict = {}
        for back in (1, 2):
            engine = self.older_engine(policy - back)
            if engine is None:
                break
            got = check_version(
                ctx, engine, rows, errors, vc.version_check_ratio, vc.version_check_t,
                behind, vc.version_draws_alpha, vc.version_check_min_samples,
            )  # fmt: skip
            stats |= {f"{k}_{back}": x for k, x in got.items()}
            closer = vc.version_draws_alpha > 0 and got.get("version_draws_claimed", 0) > got.get(
                "version_draws_older", 0
            )
            if not (got["version_error_ratio"] < 1.0 or closer):
                break
        return stats

    def judge(
        self, key: str, data: bytes, trainer_step: int | None = None, issued: dict | None = None
    ) -> Verdict | None:
        """The verdict on one file, or None when its policy version is not available.
        `trainer_step`: the step the trainer collects for, read after the file was
        claimed; an honest file is never for a later step, nor from a policy version
        not yet published (step n+1 opens before version n is published).
        `issued`: the assignment as the orchestrator issued it (its `sampler` state
        and `max_new_tokens` budget); without it the file is rejected as unassigned."""
        t0 = time.time()
        ctx = self.ctx
        if issued is not None:
            ctx = ctx.with_issued(issued)
        digest = sha256(data)
        info = parse_rollout_key(key) or {"node": "", "step": -1, "policy": -1, "counter": -1}
        v = Verdict(key, digest, info["node"], info["step"], info["policy"], accepted=False)
        try:
            info, rows = check_without_model(ctx, key, data)
            v.n_samples = len(rows)
            v.n_tokens = sum(len(r["completion_tokens"]) for r in rows)
            if trainer_step is not None and (
                info["step"] > trainer_step or info["policy"] >= trainer_step
            ):
                raise Reject(
                    "identity",
                    f"claims step {info['step']} with policy {info['policy']}, but the trainer "
                    f"is collecting step {trainer_step}",
                )
            newest = self.weights.newest()
            if newest is None or newest < info["policy"]:
                return None  # not mirrored yet; judged on a later pass
            if not self.ensure_policy(info["policy"]):
                return None
            # the tolerances of the version now loaded (a first version in another dtype
            # than the model the validator started from changes them)
            ctx = dataclasses.replace(
                ctx,
                logprob_tolerance=self.ctx.logprob_tolerance,
                sampling_tolerance=self.ctx.sampling_tolerance,
                sampling_mean_tolerance=self.ctx.sampling_mean_tolerance,
                logprob_noise=self.ctx.logprob_noise,
            )
            errors: list[float] = []
            behind: list = []
            v.stats = check_with_model(ctx, self.backend, rows, errors, behind)
            v.stats |= self.check_versions(ctx, info["policy"], rows, errors, behind)
            if info.get("unverifiable") is not None:
                raise info["unverifiable"]  # only once nothing else is wrong (checks.py)
            v.accepted = True
        except Reject as r:
            v.check, v.reason, v.samples = r.check, r.reason, r.samples
        except Exception as e:  # fail closed: a file that breaks a check is not trained on
            log.exception("error while checking %s", key)
            v.accepted = False
            v.check, v.reason = "error", f"the checks failed: {type(e).__name__}: {e}"
        v.seconds = round(time.time() - t0, 4)
        v.time = time.time()
        return v.signed(self.key)


def judge_claimed(judge: Judge, f: dict, data: bytes, trainer_step: int | None) -> Verdict | None:
    """The verdict on a file claimed from the orchestrator (`f`: the claim's file).
    Bytes that are not the submitted sha256 (the object was overwritten after
    submission, which only its uploader's URL allows) are rejected outright."""
    if sha256(data) != f["sha256"]:
        a = f["assignment"]
        v = Verdict(f["key"], f["sha256"], f["node"], a["step"], a["policy_step"], False)
        v.check, v.reason = "identity", "the stored bytes are not the ones submitted"
        v.time = time.time()
        return v.signed(judge.key)
    return judge.judge(f["key"], data, trainer_step, issued=f["assignment"])


def log_verdict(v: Verdict, log_path: Path) -> None:
    row = {k: getattr(v, k) for k in ("key", "node", "step", "policy_step", "accepted", "check")}
    row |= {"reason": v.reason[:300], "samples": len(v.samples), "seconds": v.seconds}
    row |= {"tokens": v.n_tokens, "time": v.time}
    with open(log_path, "a") as fh:
        fh.write(json.dumps(row) + "\n")


def run_validator(cfg: RunConfig, index: int) -> None:
    import torch

    torch.set_num_threads(cfg.validator.threads)
    configure_verifiers(cfg)
    environment_of(cfg)  # refused at start when it is not deterministic
    paths = cfg.paths
    key = load_or_create_key(paths.keys / f"validator-{index}.key")
    client = OrchestratorClient(cfg.orchestrator.url, key)
    if cfg.env.kind != "none" and "python" in cfg.env.tools:  # the run's interpreter
        check_interpreter(client.run_params()["config"]["env"].get("python_version", ""))
    if cfg.task.name == "verifiers":  # the run's taskset and library versions
        from swarmrl.tasks.sources.environments import check_fingerprint

        served = client.run_params()["config"]["task"].get("env_fingerprint", "")
        check_fingerprint(cfg.task.model_copy(update={"env_fingerprint": served}))
    served_reward = client.run_params()["config"]["task"].get("reward_fingerprint", "")
    check_pin(served_reward, reward_fingerprint())  # the run's own reward function, or none
    weights = open_weights_source(
        cfg, f"validator-{index}", keep=cfg.async_level + 2, client=client
    )
    device = resolve_device(cfg.validator.device, "validator.device")
    backend = make_engine(cfg, device, prefill=True)
    expect_seed(weights)  # version 0 waits for the files made from the base, below
    backend.load(Path(cfg.model.path))  # architecture and tokenizer ids; versions swap in
    seed_version_0(cfg, weights, backend, load_tokenizer(cfg.model.path))  # not downloaded
    judge = Judge(cfg, backend, weights, key, lambda: make_engine(cfg, device, prefill=True))
    where = describe(device)
    log.info("validator %d started on %s", index, where)
    while True:
        newest = weights.newest()
        r = client.call(
            "POST", "/v1/validation/claim",
            {"max_policy": -1 if newest is None else newest, "device": where},
        )  # fmt: skip
        if r["done"] and r["file"] is None:
            log.info("the orchestrator reports the run done; validator exits")
            return
        f = r["file"]
        if f is None:
            time.sleep(cfg.validator.poll_s)
            continue
        try:
            data = client.get_bytes(f["url"], cfg.orchestrator.max_file_bytes)
        except Exception as e:  # recovered: the lease runs out and the file is claimed again
            log.warning("could not download %s: %s", f["key"], e)
            time.sleep(cfg.validator.poll_s)
            continue
        v = judge_claimed(judge, f, data, r["trainer_step"])
        if v is None:
            log.info("policy of %s not mirrored yet; it will be claimed again", f["key"])
            continue
        try:
            client.call("POST", "/v1/validation/verdict", {"verdict": dataclasses.asdict(v)})
        except OrchestratorError as e:
            if e.status not in (404, 409):
                raise
            # Recovered: our lease ran out and another validator judged the file first.
            log.warning("verdict on %s not taken: %s", f["key"], e.detail)
            continue
        log_verdict(v, paths.verdicts)
        if v.accepted:
            log.info("accepted %s: %d samples, %.2fs", f["key"], v.n_samples, v.seconds)
        else:
            log.warning("REJECTED %s: %s: %s", f["key"], v.check, v.reason)
