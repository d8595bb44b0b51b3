"""The trainer process: collect, update, publish, repeat.

It talks to the orchestrator (signed with the trainer's key, the same key
that signs SHARDCAST manifests). Order of writes for step n, chosen so a
crash anywhere loses and repeats nothing:
1. `POST /v1/trainer/step` opens step n with its sampler state (workers get
   their assignments for it, validators check files against it); the batch
   is collected from the accepted files, each marked consumed by step n;
2. the curriculum sees every group read, and step n+1 is opened the same
   way (workers start on the next step while this one trains: this is where
   inference and training overlap);
3. update; append the metrics row for n;
4. save trainer state n: the optimizer (a DCP directory every rank writes its
   part of, trainer/ranks.py), then the consumed keys, curriculum and elapsed
   time in a file that names it;
5. publish version n (manifest last) — the commit point — then
   `POST /v1/trainer/published`, after which the orchestrator deletes the
   files consumed up to n.
Step 5 runs on the publisher's background thread (shardcast/origin.py) from
a snapshot of the weights, so training step n+1 does not wait for disk,
hashing or signing; versions are still published in order.
Resume (`--resume`) starts after the newest version v that has a trainer
state: it truncates metrics rows past v, tells the orchestrator (`POST
/v1/trainer/resume`), which puts the files consumed by steps after v back in
the queue, and restores the optimizer and the carried-over groups, so step
v+1 is neither lost nor repeated and no rollout is trained on twice. The
number of trainer ranks may differ from the run that saved it.
"""

from __future__ import annotations

import json
import logging
import shutil
import time
from contextlib import ExitStack
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from swarmrl.config import ConfigError, RunConfig, RunPaths
from swarmrl.device import describe, resolve_device
from swarmrl.models.loading import load_tokenizer, set_config_dtype
from swarmrl.protocol.client import OrchestratorClient, OrchestratorError
from swarmrl.protocol.identity import load_or_create_key, parse_public_key, public_key_hex
from swarmrl.protocol.manifest import MANIFEST, ManifestError, version_files
from swarmrl.protocol.rollouts import Limits
from swarmrl.shardcast.adapter import ADAPTER_CONFIG, merge
from swarmrl.shardcast.local import LocalWeights
from swarmrl.shardcast.origin import Origin, Publisher
from swarmrl.tasks.curriculum import run_curriculum
from swarmrl.tasks.sources.task_source import TaskSource
from swarmrl.tracking import Tracker
from swarmrl.trainer.advantages import scale_advantages
from swarmrl.trainer.batch import BatchCollector, OrchestratorQueue, Sample
from swarmrl.trainer.correction import mismatch_by_node
from swarmrl.trainer.diloco import PolicySync, sync_row
from swarmrl.trainer.fsdp import init_distributed, leave_distributed
from swarmrl.trainer.lora import check_swarm, save_version
from swarmrl.trainer.losses import advantage_scale
from swarmrl.trainer.ranks import Policy, follow, optimizer_dir
from swarmrl.trainer.rows import log_step, metrics_row
from swarmrl.trainer.share import share_row

log = logging.getLogger("swarmrl.trainer")


def _state_path(paths: RunPaths, step: int) -> Path:
    return paths.trainer_state / f"step_{step:06d}.pt"


def _open_step(
    client: OrchestratorClient, curriculum, step: int, policy, done: bool = False
) -> None:  # fmt: skip
    """Issue the sampler state of `step` to the orchestrator (workers and validators get
    it there), saying where the trainer computes (`swarmrl status` shows it)."""
    state = curriculum.issue(step) if not done else curriculum.state()
    body = {"step": step, "sampler": state.to_json(), "done": done}
    client.call("POST", "/v1/trainer/step", {**body, "device": describe(policy.device)})


def trainer_key(cfg: RunConfig):
    sc = cfg.shardcast
    return load_or_create_key(Path(sc.key_file) if sc.key_file else cfg.paths.keys / "trainer.key")


def _truncate_metrics(path: Path, last_step: int) -> None:
    if not path.exists():
        return
    keep = [
        line
        for line in path.read_text().splitlines()
        if line.strip() and json.loads(line)["step"] <= last_step
    ]
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(line + "\n" for line in keep))
    tmp.replace(path)


def _publish(publisher: Publisher, model, snapshot: dict, tokenizer, version: int, announce):
    """Publish `snapshot` (the CPU weights of `model`) as `version`; then `announce(version)`
    tells the orchestrator (on the publisher's thread, after the manifest is written)."""

    def write(d: Path) -> None:
        # read before saving: save_pretrained may empty the dict it is given
        floating = next(v.dtype for v in snapshot.values() if v.is_floating_point())
        save_version(model, d, snapshot)
        if (d / "config.json").exists():  # a full version (an adapter uses its base's)
            tokenizer.save_pretrained(d)
            set_config_dtype(d, str(floating).removeprefix("torch."))

    publisher.submit(version, write, lambda: announce(version))


def _record_published(paths: RunPaths, weights: LocalWeights, version: int) -> None:
    """A row of published.jsonl: the version's bytes, and its patch (LocalWeights)."""
    patch = weights.last_patch if (weights.last_patch or {}).get("version") == version else {}
    full = sum(p.stat().st_size for p in version_files(weights.path(version)))
    row = {"version": version, "time": time.time(), "full_bytes": full,
           **{f"patch_{k}": v for k, v in patch.items() if k != "version"}}  # fmt: skip
    with open(paths.published, "a") as f:
        f.write(json.dumps(row) + "\n")


def _open_weights(cfg: RunConfig, paths: RunPaths) -> tuple[LocalWeights, Origin | None]:
    sc = cfg.shardcast
    keep = cfg.async_level + 1
    base = 0 if cfg.trainer.lora.rank else None  # adapter versions adapt version 0
    if not sc.enabled:
        return LocalWeights(paths.weights, keep=keep, adapter_base=base), None
    key = trainer_key(cfg)
    weights = LocalWeights(
        paths.weights,
        keep=keep,
        adapter_base=base,
        key=key,
        shard_bytes=int(sc.shard_mb * 1e6),
        trusted_key=public_key_hex(key),
        patch_max_fraction=sc.patch_max_fraction,
        anchor_every=sc.anchor_every,
    )
    origin = Origin(weights, sc.host, sc.origin_port, sc.max_upload_mbps * 1e6)
    origin.start()
    return weights, origin


def trusted_validators(cfg: RunConfig) -> list[str] | None:
    """The validator keys whose verdicts count (None: validation is off)."""
    if not cfg.validator.enabled:
        return None
    keys = list(dict.fromkeys([*cfg.validator.public_keys, *cfg.orchestrator.validator_keys]))
    if not keys:
        found = sorted(cfg.paths.keys.glob("validator-*.pub"))
        keys = [p.read_text().strip() for p in found]
    if not keys:
        raise ConfigError(
            "validator.enabled but no validator keys: set validator.public_keys or "
            f"create {cfg.paths.keys}/validator-0.key (validators make their own)"
        )
    for k in keys:
        parse_public_key(k)  # a malformed key is a config error, not a silent mistrust
    return keys


def run_trainer(cfg: RunConfig, resume: bool = False) -> None:
    """The trainer; under torchrun (WORLD_SIZE > 1) rank 0 runs this loop and the other
    ranks follow it (trainer/ranks.py)."""
    check_swarm(cfg)
    device = resolve_device(cfg.trainer.device, "trainer.device")
    rank, world = init_distributed(device)
    torch.set_num_threads(cfg.trainer.threads)
    torch.manual_seed(cfg.seed)
    log.info("trainer rank %d of %d computes on %s", rank, world, describe(device))
    try:
        if rank > 0:
            follow(cfg, rank, world, device)
        else:
            _rank0(cfg, resume, Policy(cfg, 0, world, device))
    finally:
        # after a clean finish the ranks have already left together (ranks.py: stop);
        # after an error there is no barrier, since the others may never come
        leave_distributed(clean=False)


def _rank0(cfg: RunConfig, resume: bool, policy: Policy) -> None:
    paths = cfg.paths
    paths.trainer_state.mkdir(parents=True, exist_ok=True)
    weights, origin = _open_weights(cfg, paths)
    publisher = Publisher(weights, origin)
    try:
        with ExitStack() as stack:
            _train(cfg, resume, paths, weights, publisher, policy, stack)
    finally:
        publisher.close()
        if origin is not None:
            origin.stop()


@dataclass
class _Start:
    """Where the loop begins: the first step, the training time already spent, and
    the batch collector's carried-over groups and per-file progress."""

    step: int = 1
    elapsed_s: float = 0.0
    carry: list = field(default_factory=list)
    taken: dict = field(default_factory=dict)


def _train(cfg: RunConfig, resume: bool, paths: RunPaths, weights, publisher: Publisher, policy,
           stack: ExitStack):  # fmt: skip
    if not cfg.orchestrator.url:
        raise ConfigError("orchestrator.url is empty: the trainer takes its rollouts from there")
    key = trainer_key(cfg)
    client = OrchestratorClient(cfg.orchestrator.url, key)
    announcer = OrchestratorClient(cfg.orchestrator.url, key)  # used by the publisher's thread

    def announce(version: int) -> None:
        announcer.call("POST", "/v1/trainer/published", {"version": version})

    tokenizer = load_tokenizer(cfg.model.path)
    curriculum = run_curriculum(cfg, TaskSource(cfg.task, cfg.seed))
    found = _newest_verified(weights, paths) if resume else None
    if found is not None:
        begin = _resume(paths, policy, client, curriculum, *found)
    else:
        if resume:
            log.info("--resume given but no complete version exists; starting fresh")
        _start_fresh(cfg, paths, weights, publisher, policy, tokenizer, announce)
        begin = _Start()
    sync = _join_sites(cfg, policy, stack, begin.step)
    collector = _collector(cfg, client, begin)
    tracker = Tracker(cfg, "trainer")
    stack.callback(tracker.close)
    tracker.config()
    t_start = time.time() - begin.elapsed_s
    last = cfg.trainer.steps
    for step in range(begin.step, cfg.trainer.steps + 1):
        _open_step(client, curriculum, step, policy)
        level = curriculum.issued[step]
        try:
            # a publish that failed ends the trainer now, not when the next one is due
            batch = collector.collect(step, cfg.trainer.batch_for(step), publisher.raise_failures)
        except InterruptedError as e:  # the operator stopped the run: end it cleanly
            log.warning("step %d: %s; the trainer stops", step, e)
            policy.stop()
            publisher.flush()
            return
        curriculum.observe(step, batch.outcomes)
        _open_step(client, curriculum, step + 1, policy)
        t0 = time.time()
        scale_advantages(batch.samples, advantage_scale(cfg.trainer))
        stats = policy.step(step, batch.samples)
        train_s = time.time() - t0
        _report_mismatch(client, step, batch.samples, stats)
        synced = sync.sync(step, True) if sync and sync.due(step) else None
        snapshot = policy.snapshot()
        row = metrics_row(
            cfg, step, level, curriculum.issued[step + 1], batch, stats, train_s,
            len(collector.carry), t_start,
        )  # fmt: skip
        if sync:
            row.update(sync_row(synced, sync.outer.outer_steps, sync.bytes_sent))
        with open(paths.metrics, "a") as f:
            f.write(json.dumps(row) + "\n")
        share_row(cfg, client, tracker, row)
        _save_state(paths, policy, step, batch.consumed, collector, curriculum, row["elapsed_s"])

        def after_publish(version: int) -> None:
            announce(version)
            _record_published(paths, weights, version)
            _delete_states_before(paths, version - cfg.async_level)

        _publish(publisher, policy.model, snapshot, tokenizer, step, after_publish)
        log_step(row)
        last = step
        if cfg.trainer.max_minutes and row["elapsed_s"] >= 60 * cfg.trainer.max_minutes:
            log.info("step %d: %.1f minutes of training reached; the run ends here",
                     step, row["elapsed_s"] / 60)  # fmt: skip
            break
    _finish(paths, weights, publisher, policy, client, curriculum, last)


def _newest_verified(weights: LocalWeights, paths: RunPaths) -> tuple[int, Path] | None:
    """The newest version with a trainer state (or version 0) whose files verify, and its
    directory; a version that does not verify is deleted."""
    resumable = [v for v in weights.versions() if v == 0 or _state_path(paths, v).exists()]
    while resumable:
        v = resumable.pop()
        try:
            return v, weights.open_verified(v)
        except ManifestError as e:  # e.g. torn by a power loss: fall back to the one before
            log.warning("version %d does not verify (%s); deleting it, trying the one before", v, e)
            weights.delete(v)
    return None


def _resume(paths: RunPaths, policy, client: OrchestratorClient, curriculum, v: int,
            verified: Path) -> _Start:  # fmt: skip
    """Start the policy from version `v` and its trainer state, put the files consumed
    after `v` back in the orchestrator's queue, and drop the metrics rows past `v`."""
    begin = _Start(step=v + 1)
    state, optim = {}, None
    if v > 0:
        state = torch.load(_state_path(paths, v), weights_only=False, map_location="cpu")
        begin.elapsed_s = state["elapsed_s"]
        # a carry saved before samples kept their sampling log-probs holds scaled
        # advantages and no temperature: those few groups are dropped, not misread
        begin.carry = [
            [Sample(**x) for x in group]
            for group in state["carry"]
            if all("group_std" in x for x in group)
        ]
        begin.taken = state.get("taken", {})
        if "curriculum" in state:
            curriculum.load_dict(state["curriculum"])
        if "optimizer" not in state:
            optim = str(optimizer_dir(paths, v))
        elif policy.world > 1:
            raise ConfigError(
                f"{_state_path(paths, v)} is from an older swarmrl (optimizer inside): "
                "resume it once with trainer.ranks = 1"
            )
    policy.start(str(verified), optim)
    if "optimizer" in state:
        policy.optimizer.load_state_dict(state["optimizer"])
    moved = client.call("POST", "/v1/trainer/resume", {"version": v})["returned"]
    if moved:
        log.info("%d rollout files of unfinished steps went back to the queue", moved)
    _truncate_metrics(paths.metrics, v)
    log.info("resuming after version %d (%d trainer ranks)", v, policy.world)
    return begin


def _start_fresh(cfg: RunConfig, paths: RunPaths, weights, publisher: Publisher, policy,
                 tokenizer, announce) -> None:  # fmt: skip
    """Start the policy from `model.path`, with no metrics, and publish it as version 0
    (or announce the version 0 already there)."""
    first = policy.start(cfg.model.path)
    paths.metrics.unlink(missing_ok=True)
    if 0 not in weights.versions():
        _publish(publisher, policy.model, first, tokenizer, 0, announce)
    else:
        announce(0)


def _join_sites(cfg: RunConfig, policy, stack: ExitStack, start: int) -> PolicySync | None:
    """With trainer.diloco.sites, join the other sites (healed from a peer if behind)."""
    if not cfg.trainer.diloco.sites:
        return None
    sync = PolicySync(cfg, policy.model, policy.world)
    stack.callback(sync.close)
    pending = sync.resume(start - 1) if start > 1 else False
    sync.join(start - 1, pending)
    return sync


def _collector(cfg: RunConfig, client: OrchestratorClient, begin: _Start) -> BatchCollector:
    limits = Limits.of_run(cfg)
    queue = OrchestratorQueue(client, cfg.orchestrator.max_file_bytes)
    collector = BatchCollector(
        queue,
        limits,
        cfg.async_level,
        cfg.trainer.poll_s,
        trusted_validators(cfg),
        spot_checks=cfg.validator.sample_rate < 1.0,
        temperature=cfg.sampling.temperature,
        top_p=cfg.sampling.top_p,
    )
    collector.carry = begin.carry
    collector.taken = begin.taken
    return collector


def _report_mismatch(client: OrchestratorClient, step: int, samples, stats) -> None:
    """Per-node mismatch to the orchestrator, which sends an outlier to a validator."""
    nodes = mismatch_by_node(samples, stats.mismatch, step)
    if not nodes:
        return
    try:
        client.call("POST", "/v1/trainer/mismatch", {"step": step, "nodes": nodes})
    except OrchestratorError as e:  # a lost report loses a trust signal, not the run
        log.warning("step %d: the mismatch report was refused: %s", step, e)


def _save_state(paths: RunPaths, policy, step: int, consumed, collector: BatchCollector,
                curriculum, elapsed_s: float) -> None:  # fmt: skip
    """Trainer state `step`: the optimizer, by every rank, then the file that names it
    (consumed keys, carried-over groups, curriculum, elapsed time), replaced atomically."""
    state_file = _state_path(paths, step)
    tmp = state_file.with_suffix(".tmp")
    policy.save(paths, step)  # the optimizer, by every rank, before the state that names it
    torch.save(
        {
            "step": step,
            "consumed": consumed,
            "carry": [[asdict(x) for x in group] for group in collector.carry],
            "taken": collector.taken,
            "curriculum": curriculum.to_dict(),
            "elapsed_s": elapsed_s,
        },
        tmp,
    )
    tmp.replace(state_file)


def _delete_states_before(paths: RunPaths, step: int) -> None:
    """Delete the trainer states (files and optimizer directories) of steps before `step`."""
    for old in paths.trainer_state.glob("step_*"):
        if int(old.name[5:11]) < step:
            if old.is_dir():
                shutil.rmtree(old, ignore_errors=True)
            else:
                old.unlink(missing_ok=True)


def _finish(paths: RunPaths, weights, publisher: Publisher, policy, client: OrchestratorClient,
            curriculum, last: int) -> None:  # fmt: skip
    """After the last step: stop, publish what is queued, copy the newest version to
    final/, tell the orchestrator the run is done, and draw the report."""
    policy.stop()
    publisher.flush()
    final = paths.run / "final"
    if final.exists():
        shutil.rmtree(final)
    newest = weights.path(weights.newest())
    if (newest / ADAPTER_CONFIG).exists():  # the merged model, and the adapter beside it
        merge(weights.path(weights.base_of(weights.newest())), newest, final)
        (final / MANIFEST).unlink()  # it lists the adapter's files: adapter/ keeps it
        shutil.copytree(newest, final / "adapter")
    else:
        shutil.copytree(newest, final)
    _open_step(client, curriculum, last + 1, policy, done=True)
    from swarmrl.launch.report import write_report

    write_report(paths.metrics, paths.run / "report.png")
    log.info("done: final model in %s", final)
