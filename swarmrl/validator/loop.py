"""The validator process (`swarmrl validator`).

Forever, until the trainer reports the run done: list the rollout files that
have no verdict yet, oldest policy first; skip those already too stale to
train on (the trainer discards them); judge the others (validator/checks.py)
with the claimed policy version loaded (mirrored through the weights seam,
SHARDCAST when enabled, every version in order); write a signed verdict to
the store and a line to runs/<name>/verdicts.jsonl; move a rejected file to
`rejected/` with a `.reason.txt`, as the trainer does with a corrupt one.

With several validators each takes the files whose key hashes to its index;
they share the ledger.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from pathlib import Path

from swarmrl.config import RunConfig
from swarmrl.inference.backend import HFBackend
from swarmrl.inference.rollouts import MAX_FILE_BYTES
from swarmrl.models.loading import load_tokenizer
from swarmrl.protocol.assign import parse_rollout_key, read_status
from swarmrl.protocol.identity import load_or_create_key
from swarmrl.protocol.store import LocalDirStore
from swarmrl.shardcast.source import open_weights_source
from swarmrl.tasks.dataset import TaskSource
from swarmrl.toploc.proof import Thresholds
from swarmrl.validator.checks import Context, Reject, check_with_model, check_without_model, sha256
from swarmrl.validator.record import Ledger, Verdict, verdict_key

log = logging.getLogger("swarmrl.validator")
LOGPROB_TOLERANCE = {"float32": 2e-5, "bfloat16": 1e-2}  # see validator/checks.py, check 8


def make_context(cfg: RunConfig, tokenizer, backend) -> Context:
    v = cfg.validator
    return Context(
        cfg=cfg,
        tokenizer=tokenizer,
        source=TaskSource(cfg.task, cfg.seed),
        thresholds=Thresholds(v.max_exp_mismatches, v.max_mantissa_mean, v.max_mantissa_median),
        sampling_tolerance=v.sampling_tolerance,
        logprob_tolerance=v.logprob_tolerance
        if v.logprob_tolerance is not None
        else LOGPROB_TOLERANCE[cfg.model.dtype],
        eos_id=backend.eos_id,
        vocab=backend.model.config.vocab_size,
        hidden_size=backend.model.config.hidden_size,
        max_batch_tokens=v.max_batch_tokens,
    )


class Judge:
    """Judges files for one validator: the checks, the ledger and the loaded policy."""

    def __init__(self, cfg: RunConfig, backend: HFBackend, weights, ledger: Ledger, key):
        self.cfg = cfg
        self.backend = backend
        self.weights = weights
        self.ledger = ledger
        self.key = key
        self.ctx = make_context(cfg, load_tokenizer(cfg.model.path), backend)
        self.loaded: int | None = None

    def ensure_policy(self, version: int) -> bool:
        """Load `version`; False when this validator does not hold it (yet)."""
        if self.loaded == version:
            return True
        newest = self.weights.newest()
        if newest is None or newest < version:
            return False
        try:
            self.backend.load(self.weights.open_verified(version))
        except FileNotFoundError:  # not mirrored (yet), or retention removed it
            return False
        self.loaded = version
        return True

    def judge(self, key: str, data: bytes, trainer_step: int | None = None) -> Verdict | None:
        """The verdict on one file, or None when its policy version is not available.
        `trainer_step`: the step the trainer collects for, read after the file was
        listed; an honest file is never for a later step, nor from a policy version
        not yet published (the status moves to n+1 before version n is published)."""
        t0 = time.time()
        digest = sha256(data)
        info = parse_rollout_key(key) or {"node": "", "step": -1, "policy": -1, "counter": -1}
        v = Verdict(key, digest, info["node"], info["step"], info["policy"], accepted=False)
        try:
            info, rows = check_without_model(self.ctx, key, data)
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
            earlier = self.ledger.claim(digest, key, info["node"], info["step"], info["counter"])
            if earlier is not None:
                raise Reject("replay", f"replay: same bytes or assignment as {earlier}")
            if not self.ensure_policy(info["policy"]):
                self.ledger.release(digest)
                return None
            v.stats = check_with_model(self.ctx, self.backend, rows)
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


def _mine(key: str, index: int, count: int) -> bool:
    return int(hashlib.sha256(key.encode()).hexdigest()[:8], 16) % count == index


def publish_verdict(store, ledger: Ledger, v: Verdict, data: bytes, log_path: Path) -> None:
    """Verdict object first, then the file's move and the ledger (a crash re-judges nothing)."""
    store.put(verdict_key(v.key), v.to_json())
    if not v.accepted:
        name = v.key.replace("/", "__")
        store.put(f"rejected/{name}", data)
        store.put(f"rejected/{name}.reason.txt", f"{v.check}: {v.reason}".encode())
        store.delete(v.key)
    if v.check != "replay":
        ledger.settle(v.sha256, v.accepted)
    row = {k: getattr(v, k) for k in ("key", "node", "step", "policy_step", "accepted", "check")}
    row |= {"reason": v.reason[:300], "samples": len(v.samples), "seconds": v.seconds}
    row |= {"tokens": v.n_tokens, "time": v.time}
    with open(log_path, "a") as fh:
        fh.write(json.dumps(row) + "\n")


def run_validator(cfg: RunConfig, index: int) -> None:
    import torch

    torch.set_num_threads(cfg.validator.threads)
    paths = cfg.run_paths()
    key = load_or_create_key(paths["keys"] / f"validator-{index}.key")
    weights = open_weights_source(cfg, f"validator-{index}", keep=cfg.async_level + 2)
    store = LocalDirStore(paths["store"])
    ledger = Ledger(paths["validator"] / "ledger.sqlite")
    backend = HFBackend(dtype=cfg.model.dtype)
    backend.load(Path(cfg.model.path))  # architecture and tokenizer ids; versions swap in
    judge = Judge(cfg, backend, weights, ledger, key)
    count = cfg.validator.count
    log.info("validator %d started (1 of %d)", index, count)
    while True:
        status = read_status(paths["status"])
        if status and status.get("done"):
            log.info("trainer reports the run done; validator exits")
            return
        step = int(status["step"]) if status else 0
        todo = []
        for k in store.list("rollouts"):
            info = parse_rollout_key(k)
            if info and info["policy"] < step - cfg.async_level:
                continue  # stale: the trainer discards it without a verdict
            if _mine(k, index, count) and not store.exists(verdict_key(k)):
                todo.append(((info or {}).get("policy", -1), k))
        judged = 0
        for _, k in sorted(todo):
            try:
                too_big = store.size(k) > MAX_FILE_BYTES
                data = b"" if too_big else store.get(k)
            except FileNotFoundError:
                continue
            status = read_status(paths["status"]) or {"step": step}
            v = judge.judge(k, data, int(status["step"]))
            if v is not None and too_big:
                v.check, v.reason = "schema", f"file is over {MAX_FILE_BYTES} bytes"
            if v is None:
                continue
            publish_verdict(store, ledger, v, data, paths["verdicts"])
            judged += 1
            if v.accepted:
                log.info("accepted %s: %d samples, %.2fs", k, v.n_samples, v.seconds)
            else:
                log.warning("REJECTED %s: %s: %s", k, v.check, v.reason)
        if not judged:
            time.sleep(cfg.validator.poll_s)
