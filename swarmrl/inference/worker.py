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
   why to wait (it asks again after a pause that doubles while it waits:
   `AskPacer`); generate `groups_per_file` prompt groups of `group_size`
   completions (prompts and Gumbel-max seeds fixed by the assignment, TOPLOC
   proofs built from the hidden states on the way), score them with the
   task's verifier, write one rollout file, ask for an upload URL, upload,
   submit. A background thread heartbeats meanwhile so a long file does not
   make the node look dead.
Weights are hot-swapped whenever a newer version is complete. The loop ends
when the orchestrator says the run is done.

The work of one file is a chain of public steps: `with_budget` (the node's
length budget), `plan_prompts`, `complete`, `score_rows` (`score_row` per
sample), all in inference/rows.py, then `write_rollouts` and `upload_file`;
`build_rows` chains the first four.
They are the seam a simulated worker is built on (the dishonest workers of
`swarmrl/sim/`, which redo all but one step honestly): `run_worker` takes a
`FileWork` (the rows of a file and their upload; `HonestWork` by default)
and one more parameter, `after_load`, for a worker that alters the model
after every weights load. The honest worker carries no hook of its own for
them; this module imports nothing from `sim/`.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import platform
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from swarmrl.config import RunConfig
from swarmrl.device import describe, resolve_device
from swarmrl.envs.environment import environment_of
from swarmrl.errors import EXIT_REFUSED, UserError
from swarmrl.inference.engine import make_engine, resolve_engine
from swarmrl.inference.pacing import AskPacer, upload_waiting
from swarmrl.inference.rows import (  # noqa: F401  (the seam: sim/ and the benches use these here)
    build_rows,
    complete,
    complete_with,
    plan_prompts,
    score_row,
    score_rows,
    with_budget,
)
from swarmrl.inference.trajectory import check_turns
from swarmrl.models.loading import ModelLoadError, load_tokenizer, resolve_model_path
from swarmrl.procs import process_started
from swarmrl.protocol.assign import Assignment
from swarmrl.protocol.client import OrchestratorClient, OrchestratorError
from swarmrl.protocol.identity import load_or_create_key, public_key_hex
from swarmrl.protocol.rollouts import write_rollouts
from swarmrl.protocol.sampler import SamplerState
from swarmrl.shardcast.adapter import model_dir
from swarmrl.shardcast.seed import drop_seed, expect_seed, seed_version_0
from swarmrl.shardcast.source import open_weights_source
from swarmrl.tasks.grading import configure as configure_verifiers
from swarmrl.tasks.sources.task_source import TaskSource

log = logging.getLogger("swarmrl.worker")

WARM_UP_SEED = 0x5EED


class NodeRefused(UserError, RuntimeError):
    """The orchestrator refuses this node (ejected, banned, or below the requirements)."""

    exit_code = EXIT_REFUSED


def upload_file(client: OrchestratorClient, a: Assignment, data: bytes) -> str:
    """Ask for a signed URL for this assignment's file, upload it, submit it; the file's key."""
    digest = hashlib.sha256(data).hexdigest()
    body = {"counter": a.counter, "size": len(data), "sha256": digest}
    grant = client.call("POST", "/v1/uploads", body)
    client.put_bytes(grant["url"], data, grant["headers"])
    client.call("POST", "/v1/submit", {"key": grant["key"], "sha256": digest})
    return grant["key"]


class FileWork(Protocol):
    """What a node makes of one assignment: the rows of its file, and their upload."""

    name: str

    def rows(
        self, cfg: RunConfig, tokenizer, source: TaskSource, backend, a: Assignment, node: str
    ) -> list[dict]: ...

    def upload(self, client: OrchestratorClient, a: Assignment, data: bytes) -> str: ...


class HonestWork:
    """`FileWork` as the protocol asks for it: `build_rows` and `upload_file`."""

    name = "honest"

    def rows(self, cfg, tokenizer, source, backend, a, node) -> list[dict]:
        return build_rows(cfg, tokenizer, source, backend, a, node)

    def upload(self, client, a, data) -> str:
        return upload_file(client, a, data)


def hardware_report(cfg: RunConfig, backend, tokenizer, threads: int, device: str) -> dict:
    """What this machine offers: CPUs, memory, GPUs, the device it generates on, and
    tokens/s of the run's model measured on one group of `group_size` completions."""
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
        "device": device,
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


def _refused(e: OrchestratorError) -> None:
    """Raise NodeRefused for a 403: the orchestrator will not take this node's work."""
    if e.status == 403:
        raise NodeRefused(e.detail) from None


def _assignment(j: dict) -> Assignment:
    """The assignment of a heartbeat answer."""
    return Assignment(
        step=j["step"],
        policy_step=j["policy_step"],
        seed=j["seed"],
        counter=j["counter"],
        sampler=SamplerState.from_json(j["sampler"] or {}),
        max_new_tokens=j["max_new_tokens"],
    )


@dataclass
class WorkerNode:
    """A node that joined a run: what it follows, generates with and reports, and the
    steps of the loop (`run_worker`) on them."""

    cfg: RunConfig
    client: OrchestratorClient
    params: dict  # the run's public parameters (GET /v1/run)
    node: str  # the node's public key, hex
    weights: object  # the weights source: newest() and open_verified(version)
    source: TaskSource
    backend: object  # the generation backend
    threads: int
    device: object  # the torch device it generates on (swarmrl/device.py)
    work: FileWork
    after_load: Callable | None = None
    tokenizer: object = None  # loaded with the first weights
    loaded: int | None = None  # the policy version in the backend
    hardware: dict | None = None  # measured once, before the first registration
    beat: Heartbeat | None = None
    invite: str = ""  # the operator's invitation, if this node has one
    pacer: AskPacer | None = None  # when to ask for work again (made by `enlist`)
    files_log: Path | None = None  # a JSON line per file made, then one with its fate

    def record(self, event: str, a: Assignment | None = None, **fields) -> None:
        """A line of `files_log` (`<home>/files.jsonl`): `start` when the process starts,
        `made` when a file's bytes are written, then `submitted`, `refused` (the
        orchestrator's status and reason) or `failed` (anything else, the worker then
        exits). A `made` line with no fate after it is a file the worker died holding."""
        if self.files_log is None:
            return
        line = {"event": event, "time": round(time.time(), 3), **fields}
        if a is not None:
            line |= {"step": a.step, "policy": a.policy_step, "counter": a.counter}
        try:
            with open(self.files_log, "a") as f:
                f.write(json.dumps(line) + "\n")
        except OSError as e:  # recovered: a diagnostic record; the file's work goes on
            log.warning("files.jsonl: %s", e)

    def follow_weights(self) -> bool:
        """Load the newest complete policy version unless it is loaded; False (after a
        pause) while there is none, and False when it vanished while being read."""
        newest = self.weights.newest()
        if newest is None:
            time.sleep(self.cfg.worker.poll_s)
            return False
        if newest != self.loaded:
            try:
                t0 = time.time()  # an adapter version's merge included
                path = model_dir(self.weights, newest)
                self.backend.load(path)
                if self.after_load is not None:
                    self.after_load(self.backend)
                if self.tokenizer is None:
                    self.tokenizer = load_tokenizer(str(path))
                    check_turns(environment_of(self.cfg), self.tokenizer, self.backend.eos_id)
            except FileNotFoundError:
                # Recovered: retention deleted this version while we read it; look again.
                return False
            log.info("loaded policy version %d in %.2fs", newest, time.time() - t0)
            self.loaded = newest
        return True

    def start_early(self) -> None:
        """Before any version is here (the trainer is still publishing version 0): load
        the engine from the run's base model when this node holds it (`model.path`),
        measure the hardware on it and register. Version 0, once fetched and verified,
        is then a weights swap into a loaded engine (`after_load`, a simulated cheater's
        seam, runs after the base's load, before the warm-up that uses it, and after
        every other). Nothing is generated from
        weights the trainer did not sign: work is asked for only with a verified version
        loaded. Skipped where the base is not here."""
        if self.weights.newest() is not None:
            return
        try:
            resolve_model_path(self.cfg.model.path)
            expect_seed(self.weights)  # version 0 waits for the files made from the base
            t0 = time.time()
            self.backend.load(Path(self.cfg.model.path))
        except (ModelLoadError, OSError) as e:  # recovered: version 0 loads it instead
            drop_seed(self.weights)
            log.info("base model not loaded before version 0 (%s)", e)
            return
        self.tokenizer = load_tokenizer(self.cfg.model.path)
        check_turns(environment_of(self.cfg), self.tokenizer, self.backend.eos_id)
        log.info("loaded the base model in %.2fs while version 0 is published", time.time() - t0)
        seed_version_0(self.cfg, self.weights, self.backend, self.tokenizer)  # the base as is
        if self.after_load is not None:  # the seam runs after every load, this one too
            self.after_load(self.backend)
        self.enlist()

    def warm_up(self) -> None:
        """Make one file the whole way (prompts, generation, scores, proofs, the parquet
        bytes) and throw it away, before the hardware probe and the first request for
        work: a first file otherwise pays every first call's cost (lazy imports,
        allocations, kernels chosen, a compiled graph) and took 3 to 10 times a later
        one's time in the open swarm, long enough to arrive stale. One group: the
        first calls are what it is for, not the file's size. Nothing is uploaded, so
        the fixed seed of its prompts matters to no one."""
        t0 = time.time()
        probe = Assignment(step=0, policy_step=self.loaded or 0, seed=WARM_UP_SEED, counter=0)
        cfg = self.cfg.model_copy(
            update={"worker": self.cfg.worker.model_copy(update={"groups_per_file": 1})}
        )
        rows = self.work.rows(cfg, self.tokenizer, self.source, self.backend, probe, self.node)
        write_rollouts(rows)
        log.info("warmed up on a file of one group in %.2fs (not uploaded)", time.time() - t0)

    def register(self, c: OrchestratorClient | None = None) -> None:
        """Register (again) with the hardware measured at the first registration."""
        c = c or self.client
        r = c.register({"role": "worker", "hardware": self.hardware}, self.invite)
        log.info("registered: stake %.1f, length budget %d", r["stake"], r["max_new_tokens"])

    def enlist(self) -> None:
        """Once, with the first weights loaded: measure the hardware, register, start
        the heartbeat thread."""
        if self.hardware is not None:
            return
        self.warm_up()
        self.hardware = hardware_report(
            self.cfg, self.backend, self.tokenizer, self.threads, describe(self.device)
        )
        log.info("hardware: %s", self.hardware)
        try:
            self.register()
        except OrchestratorError as e:
            _refused(e)
            raise
        self.beat = Heartbeat(self.client, self.params["heartbeat_s"], self.register)
        self.beat.thread.start()
        self.pacer = AskPacer(self.cfg.worker.poll_s, self.params["heartbeat_s"])

    def newer_version(self) -> bool:
        newest = self.weights.newest()
        return newest is not None and newest != self.loaded

    def ask_for_work(self) -> dict | None:
        """The heartbeat answer to a request for work; None when the node had been
        declared dead and registered again."""
        self.beat.policy = self.loaded
        try:
            return self.client.call(
                "POST", "/v1/nodes/heartbeat", {"policy_version": self.loaded, "want_work": True}
            )
        except OrchestratorError as e:
            _refused(e)
            if e.status != 409:
                raise
            self.register()
            return None

    def do_file(self, a: Assignment) -> None:
        """Generate, score, write and upload the file of `a`; an upload refused for
        another reason than the node's ejection is logged and the file dropped."""
        t0 = time.time()
        rows = self.work.rows(self.cfg, self.tokenizer, self.source, self.backend, a, self.node)
        data = write_rollouts(rows)
        self.record("made", a, size=len(data))
        try:
            key = upload_waiting(lambda: self.work.upload(self.client, a, data))
        except OrchestratorError as e:
            log.warning("upload refused: %s", e)
            self.record("refused", a, status=e.status, reason=e.detail[:200])
            _refused(e)
            return
        except BaseException as e:
            self.record("failed", a, error=repr(e)[:200])
            raise
        self.record("submitted", a, key=key)
        n_tok = sum(len(r["completion_tokens"]) for r in rows)
        mean_r = sum(r["reward"] for r in rows) / len(rows)
        dt = time.time() - t0
        log.info(
            "step %d policy %d: %d samples, reward %.3f, %.0f tok/s in %.2fs -> %s",
            a.step,
            a.policy_step,
            len(rows),
            mean_r,
            n_tok / max(dt, 1e-9),
            dt,
            key,
        )


def join_run(
    url: str,
    home: Path,
    threads: int,
    backend: str | None,
    work: FileWork | None,
    after_load: Callable | None,
    device: str = "auto",
) -> WorkerNode:
    """Load or create the node key, read the run's parameters, and set up the weights
    source, the task source and the generation backend (not registered yet)."""
    key = load_or_create_key(home / "node.key")
    node = public_key_hex(key)
    client = OrchestratorClient(url, key)
    params = client.run_params()
    cfg = _node_config(params, home, client)
    configure_verifiers(cfg)
    environment_of(cfg)  # an environment a validator could not recompute stops here
    weights = open_weights_source(
        cfg, node[:12], client=client, root=home / "weights", servers=params["servers"],
        trusted_key=params["trainer_key"], latency_log=home / "weights_latency.jsonl",
    )  # fmt: skip
    source = TaskSource(cfg.task, cfg.seed)
    which = resolve_engine(backend or cfg.inference.backend)
    if cfg.env.kind != "none" and (backend or cfg.inference.backend) == "auto":
        which = "hf"  # as make_engine: multi-turn runs use vLLM only when it is named
    if work is not None and which != "hf":  # a simulated worker edits the HF model
        log.info("--cheat %s: generating with the hf backend, not %s", work.name, which)
        which = "hf"
    where = resolve_device(device, "swarmrl worker --device")
    backend = make_engine(cfg, where, threads, which)
    work = work or HonestWork()
    log.info(
        "node %s (%s, %s backend on %s) joining run %s at %s", node, work.name, which,
        describe(where), params["run_id"], url,
    )  # fmt: skip
    return WorkerNode(
        cfg=cfg, client=client, params=params, node=node, weights=weights, source=source,
        backend=backend, threads=threads, device=where, work=work, after_load=after_load,
        files_log=home / "files.jsonl",
    )  # fmt: skip


def run_worker(
    url: str,
    home: Path,
    threads: int = 1,
    backend: str | None = None,
    work: FileWork | None = None,
    after_load: Callable | None = None,
    invite: str = "",
    device: str = "auto",
) -> None:
    """Join the run at `url` and work until it is done (with the operator's `invite`
    if it has one; otherwise it pays the run's proof of work). `backend` overrides the run's
    `inference.backend` and `device` says where to generate (this machine's choices). `work` makes and uploads each file
    (default `HonestWork`); a simulated worker passes its own, which generates with the
    hf backend. `after_load(backend)` runs after every weights load, before the hardware
    probe: the seam for a simulated worker that runs a model other than the policy.
    Raises NodeRefused when the orchestrator refuses the node."""
    began = round(process_started(), 3)  # the start line's time: before the imports too
    import torch

    torch.set_num_threads(threads)
    home = Path(home)
    home.mkdir(parents=True, exist_ok=True)
    w = join_run(url, home, threads, backend, work, after_load, device)
    w.record("start", node=w.node, work=w.work.name, time=began)
    w.invite = invite
    w.start_early()
    waiting = None  # the last reason the orchestrator gave for no work
    while True:
        if not w.follow_weights():
            continue
        w.enlist()
        hb = w.ask_for_work()
        if hb is None:
            continue
        if hb["done"]:
            log.info("the orchestrator reports the run done; worker exits")
            w.beat.stop.set()
            return
        if hb["assignment"] is None:
            if hb.get("wait") != waiting:  # each new reason once: why a node gets no work
                waiting = hb.get("wait")
                log.info("no work: %s (step %s, holding policy %s)", waiting, hb["step"], w.loaded)
            w.pacer.wait(w.newer_version)
            continue
        waiting = None
        w.pacer.assigned()
        a = _assignment(hb["assignment"])
        if a.policy_step != w.loaded:
            continue  # assigned before a swap: the orchestrator re-issues it at our version
        w.do_file(a)
