"""The inference worker: `swarmrl worker --orchestrator URL`, and nothing else.

A contributor's machine needs no file of the run and no shared directory,
and makes only outbound connections (it works behind NAT):
1. create or load the node key (`<home>/node.key`, mode 0600): the node's
   identity, which signs every call (protocol/signing.py);
2. `GET /v1/run`: the run's public parameters (config, SHARDCAST servers,
   the trainer's public key, the dataset's sha256 if the run has one);
3. mirror the policy through SHARDCAST into `<home>/weights` (only versions
   signed by the trainer's key are loaded); the tokenizer comes with them;
4. measure the hardware (CPUs, memory, GPUs, and a short generation probe
   with the run's model) and register with it, which locks the stake;
5. forever: heartbeat asking for work; the answer carries the assignment
   (step, policy version, counter, seed, length budget, sampler state) or
   why to wait; generate `groups_per_file` prompt groups of `group_size`
   completions (prompts and Gumbel-max seeds fixed by the assignment, TOPLOC
   proofs built from the hidden states on the way), score them with the
   task's verifier, write one rollout file, ask for an upload URL, upload,
   submit. A background thread heartbeats meanwhile so a long file does not
   make the node look dead.
Weights are hot-swapped whenever a newer version is complete. The loop ends
when the orchestrator says the run is done.
"""

from __future__ import annotations

import hashlib
import logging
import os
import platform
import threading
import time
from pathlib import Path

from swarmrl.config import RunConfig
from swarmrl.inference.engine import make_engine, resolve_engine
from swarmrl.inference.generation import Completion
from swarmrl.models.loading import load_tokenizer
from swarmrl.models.prompting import decode_completion
from swarmrl.protocol.assign import Assignment
from swarmrl.protocol.client import OrchestratorClient, OrchestratorError
from swarmrl.protocol.identity import load_or_create_key, public_key_hex
from swarmrl.protocol.prompts import AssignedPrompt, assigned_prompts
from swarmrl.protocol.rollouts import write_rollouts
from swarmrl.protocol.sampler import SamplerState
from swarmrl.shardcast.source import open_weights_source
from swarmrl.tasks.graders.registry import configure as configure_verifiers
from swarmrl.tasks.graders.registry import verify
from swarmrl.tasks.length import length_penalty
from swarmrl.tasks.sources.task_source import TaskSource

log = logging.getLogger("swarmrl.worker")


class NodeRefused(RuntimeError):
    """The orchestrator refuses this node (ejected, banned, or below the requirements)."""


class Honest:
    """The worker's steps for one file. The cheats of `sim/cheats.py` override some of
    them; an honest worker runs them as they are."""

    name = "honest"

    def after_load(self, backend) -> None:
        """Called after every weights load."""

    def plan(self, cfg: RunConfig, source, tokenizer, a: Assignment) -> list[AssignedPrompt]:
        return assigned_prompts(cfg, source, tokenizer, a.seed, a.sampler or SamplerState())

    def complete(self, cfg: RunConfig, backend, plan: list[AssignedPrompt]) -> list[Completion]:
        """One completion per sample, flat, group after group."""
        s = cfg.sampling
        prompts = [p.tokens for p in plan for _ in p.seeds]
        seeds = [seed for p in plan for seed in p.seeds]
        return backend.generate(prompts, seeds, s.max_new_tokens, s.temperature, s.top_p)

    def tamper(self, cfg, tokenizer, backend, plan, rows: list[dict]) -> list[dict]:
        return rows

    def upload(self, client: OrchestratorClient, a: Assignment, data: bytes) -> str:
        """Ask for a signed URL for this assignment's file, upload it, submit it."""
        return upload_file(client, a, data)


def upload_file(client: OrchestratorClient, a: Assignment, data: bytes) -> str:
    digest = hashlib.sha256(data).hexdigest()
    body = {"counter": a.counter, "size": len(data), "sha256": digest}
    grant = client.call("POST", "/v1/uploads", body)
    client.put_bytes(grant["url"], data, grant["headers"])
    client.call("POST", "/v1/submit", {"key": grant["key"], "sha256": digest})
    return grant["key"]


def score_row(cfg: RunConfig, tokenizer, p: AssignedPrompt, g: int, j: int, c: Completion) -> dict:
    """The rollout row of sample j of group g, scored by the task's verifier."""
    completion = decode_completion(tokenizer, c.tokens)
    task_reward = verify(p.task, completion)
    lr = cfg.length_reward
    penalty = length_penalty(lr.mode, len(c.tokens), p.target_length, lr.coef)
    return {
        "problem_id": p.task.problem_id,
        "group": g,
        "prompt_tokens": p.tokens,
        "completion_tokens": c.tokens,
        "completion_logprobs": c.logprobs,
        "reward": task_reward - penalty,
        "task_reward": task_reward,
        "length_penalty": penalty,
        "target_length": p.target_length,
        "seed": p.seeds[j],
        "temperature": cfg.sampling.temperature,
        "proofs": c.proofs,
        "task_type": p.task.task_type,
        "prompt": p.text,
        "completion": completion,
    }


def build_rows(
    cfg: RunConfig, tokenizer, source: TaskSource, backend, a: Assignment, node: str, how=None
) -> list[dict]:
    how = how or Honest()
    if a.max_new_tokens and a.max_new_tokens != cfg.sampling.max_new_tokens:  # the node's budget
        cfg = cfg.model_copy(
            update={
                "sampling": cfg.sampling.model_copy(update={"max_new_tokens": a.max_new_tokens})
            }
        )
    plan = how.plan(cfg, source, tokenizer, a)
    completions = iter(how.complete(cfg, backend, plan))
    rows = []
    for g, p in enumerate(plan):
        for j in range(len(p.seeds)):
            row = score_row(cfg, tokenizer, p, g, j, next(completions))
            rows.append(row | {"step": a.step, "policy_step": a.policy_step, "node": node})
    return how.tamper(cfg, tokenizer, backend, plan, rows)


def hardware_report(cfg: RunConfig, backend, tokenizer, threads: int) -> dict:
    """What this machine offers: CPUs, memory, GPUs, and tokens/s of the run's model
    measured on one group of `group_size` completions."""
    import torch

    try:
        pages = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):  # not POSIX: report none rather than guess
        pages = 0
    gpus = (
        [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        if torch.cuda.is_available()
        else []
    )
    s = cfg.sampling
    prompt = tokenizer("Reverse: probe")["input_ids"]
    n = cfg.worker.group_size
    t0 = time.perf_counter()
    out = backend.generate([prompt] * n, list(range(n)), s.max_new_tokens, s.temperature, s.top_p)
    tokens = sum(len(c.tokens) for c in out)
    return {
        "cpus": threads,
        "memory_gb": round(pages / 1e9, 2),
        "gpus": gpus,
        "tokens_per_s": round(tokens / max(time.perf_counter() - t0, 1e-9), 1),
        "platform": f"{platform.system()} {platform.machine()} Python {platform.python_version()}",
    }


class Heartbeat:
    """Heartbeats on a thread of its own while the worker generates."""

    def __init__(self, client: OrchestratorClient, every_s: float, register):
        self.client = OrchestratorClient(client.url, client.key)
        self.every_s = every_s
        self.register = register
        self.policy: int | None = None
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True, name="heartbeat")

    def _run(self) -> None:
        while not self.stop.wait(self.every_s):
            try:
                self.client.call(
                    "POST",
                    "/v1/nodes/heartbeat",
                    {"policy_version": self.policy, "want_work": False},
                )
            except OrchestratorError as e:
                if e.status == 409:  # declared dead while we were away: join again
                    self.register(self.client)
                else:
                    log.warning("heartbeat refused: %s", e)
            except ConnectionError as e:  # recovered: the main loop meets the same outage
                log.warning("heartbeat: %s", e)


def _node_config(params: dict, home: Path, client: OrchestratorClient) -> RunConfig:
    """The run's public config, with the dataset (if any) fetched into `home`."""
    cfg = RunConfig.model_validate(params["config"])
    if params.get("dataset"):
        d = params["dataset"]
        path = home / "dataset" / d["name"]
        have = path.exists() and hashlib.sha256(path.read_bytes()).hexdigest() == d["sha256"]
        if not have:
            data = client.get_bytes(client.url + "/v1/run/dataset", 1 << 32)
            if hashlib.sha256(data).hexdigest() != d["sha256"]:
                raise OrchestratorError(
                    502, "the dataset does not hash to its announced sha256", "/v1/run/dataset"
                )
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
        cfg = cfg.model_copy(update={"task": cfg.task.model_copy(update={"dataset": str(path)})})
    return cfg


def run_worker(
    url: str, home: Path, cheat: str | None = None, threads: int = 1, backend: str | None = None
) -> None:
    """`backend` overrides the run's `inference.backend` (this machine's choice)."""
    import torch

    torch.set_num_threads(threads)
    home = Path(home)
    home.mkdir(parents=True, exist_ok=True)
    how = Honest()
    if cheat:
        from swarmrl.sim.cheats import make_cheat

        how = make_cheat(cheat, seed=int(hashlib.sha256(str(home).encode()).hexdigest()[:6], 16))
    key = load_or_create_key(home / "node.key")
    node = public_key_hex(key)
    client = OrchestratorClient(url, key)
    params = client.run_params()
    cfg = _node_config(params, home, client)
    configure_verifiers(cfg)
    weights = open_weights_source(
        cfg, node[:12], client=client, root=home / "weights", servers=params["servers"],
        trusted_key=params["trainer_key"], latency_log=home / "weights_latency.jsonl",
    )  # fmt: skip
    source = TaskSource(cfg.task, cfg.seed)
    which = resolve_engine(backend or cfg.inference.backend)
    if cheat and which != "hf":  # the cheats edit the HF model (and generate with it)
        log.info("--cheat %s: generating with the hf backend, not %s", cheat, which)
        which = "hf"
    backend = make_engine(cfg, threads, which)
    tokenizer = None
    loaded: int | None = None
    log.info(
        "node %s (%s, %s backend) joining run %s at %s", node, how.name, which,
        params["run_id"], url,
    )  # fmt: skip

    def register(c: OrchestratorClient = client) -> None:
        r = c.call("POST", "/v1/nodes/register", {"role": "worker", "hardware": hardware})
        log.info("registered: stake %.1f, length budget %d", r["stake"], r["max_new_tokens"])

    hardware = None
    beat = None
    while True:
        newest = weights.newest()
        if newest is None:
            time.sleep(cfg.worker.poll_s)
            continue
        if newest != loaded:
            try:
                path = weights.open_verified(newest)
                t0 = time.time()
                backend.load(path)
                how.after_load(backend)
                if tokenizer is None:
                    tokenizer = load_tokenizer(str(path))
            except FileNotFoundError:
                # Recovered: retention deleted this version while we read it; look again.
                continue
            log.info("loaded policy version %d in %.2fs", newest, time.time() - t0)
            loaded = newest
        if hardware is None:
            hardware = hardware_report(cfg, backend, tokenizer, threads)
            log.info("hardware: %s", hardware)
            try:
                register()
            except OrchestratorError as e:
                if e.status == 403:
                    raise NodeRefused(e.detail) from None
                raise
            beat = Heartbeat(client, params["heartbeat_s"], register)
            beat.thread.start()
        beat.policy = loaded
        try:
            hb = client.call(
                "POST", "/v1/nodes/heartbeat", {"policy_version": loaded, "want_work": True}
            )
        except OrchestratorError as e:
            if e.status == 403:
                raise NodeRefused(e.detail) from None
            if e.status != 409:
                raise
            register()
            continue
        if hb["done"]:
            log.info("the orchestrator reports the run done; worker exits")
            beat.stop.set()
            return
        if hb["assignment"] is None:
            time.sleep(cfg.worker.poll_s)
            continue
        j = hb["assignment"]
        from swarmrl.protocol.sampler import SamplerState

        a = Assignment(
            step=j["step"],
            policy_step=j["policy_step"],
            seed=j["seed"],
            counter=j["counter"],
            sampler=SamplerState.from_json(j["sampler"] or {}),
            max_new_tokens=j["max_new_tokens"],
        )
        if a.policy_step != loaded:
            continue  # assigned before a swap: the orchestrator re-issues it at our version
        t0 = time.time()
        rows = build_rows(cfg, tokenizer, source, backend, a, node, how)
        data = write_rollouts(rows)
        try:
            key = how.upload(client, a, data)
        except OrchestratorError as e:
            log.warning("upload refused: %s", e)
            if e.status == 403:
                raise NodeRefused(e.detail) from None
            continue
        n_tok = sum(len(r["completion_tokens"]) for r in rows)
        mean_r = sum(r["reward"] for r in rows) / len(rows)
        dt = time.time() - t0
        log.info(
            "step %d policy %d: %d samples, reward %.3f, %.0f tok/s -> %s",
            a.step,
            a.policy_step,
            len(rows),
            mean_r,
            n_tok / max(dt, 1e-9),
            key,
        )
