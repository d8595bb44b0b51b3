"""Work: assignments and uploads, as state changes (what follows a submission,
validation and the trainer's queue, is orchestrator/files.py).

A file's life (`files.state`):

    uploading ──submit──► pending ──validator accepts──► accepted ──trainer──► consumed ──► trained
        │                    │    (or, not drawn for a spot check, accepted unchecked)
        │                    └──validator rejects──► rejected (the node is ejected and slashed)
        └── any state but trained: policy older than step − async_level ──► stale

`void = 1` marks the contributions of an ejected or banned node that were not
final yet: a void file is never listed to the trainer and earns nothing.
`final = 1` once `validity_window_s` has passed since submission without the
node being caught.

Assignments (`assignments.state`): open → uploading → submitted; an open one
whose node dies or whose deadline passes becomes `orphaned`, and the next
node that asks for work gets a new assignment that records it
(`reissue_of`); `cancelled` when its node is ejected.

Pipelined steps (`orchestrator.assign = "pipelined"`): a new assignment goes to a
node only if its file would still be fresh when the trainer takes it. Where it
stands in the queue says which step that is (`queue.queued_for`): behind the groups the
step being collected has taken and every group already out, at the groups a step
has taken lately (the least of the last eight: it counts the groups without
signal the trainer drops). No work goes out for a step past the run's last
(`trainer.steps`). So while step n trains and n + 1 is collected, a node
a version behind (policy n - 1) fills n + 1 instead of waiting for version n; once
n + 1's work is out, it waits (`late-for-its-step`), and nodes on version n make
n + 2's. The trainer takes the oldest policy first (files.trainer_files), as the
estimate assumes. The rule before it (`assign = "slack"`) gave work only to a node
whose policy left `work_slack_steps` steps before staleness: nobody worked during
an update, and every second step waited for a version (the "two-step cycle").

How much work is out: the groups of open assignments and of files still on
their way to the trainer (uploading, pending, accepted) whose policy is
fresh (an assignment held past that can only make a stale file). A proven
node gets a new assignment only while the proven nodes' share stays within `worker.max_pending_groups` (default
`trainer.batch_groups`) plus `orchestrator.margin_groups`, so workers stop
making files that would arrive stale, and, when room is short, only if
faster nodes waiting for work keep theirs (`faster-first`); nodes on
probation draw from a pool of their own, and a deadline follows the node's
pace (orchestrator/admission.py).

The assignment counter is one sequence for the whole run, issued here: a
worker cannot choose it, so it cannot search seeds for easy prompts, and
the (node, step, counter) of a file is known before it exists (one file per
assignment, its key fixed by the orchestrator).
"""

from __future__ import annotations

import json
import secrets

from swarmrl.orchestrator import admission, queue, turns
from swarmrl.orchestrator.mismatch import is_suspect, reference_kl, window_figures
from swarmrl.orchestrator.nodes import require_worker, touch
from swarmrl.orchestrator.service import ApiError, Service, stored_object
from swarmrl.protocol.assign import Assignment, rollout_key
from swarmrl.protocol.seeds import derive_seed
from swarmrl.protocol.verdict import BLAMELESS_CHECKS

ON_THE_WAY = ("uploading", "pending", "accepted")
FILE_STATES = (*ON_THE_WAY, "consumed", "trained", "rejected", "stale", "discarded")


def run_state(svc: Service, cur) -> dict:
    """The trainer's step, the newest published policy, done and paused (one query:
    every heartbeat asks)."""
    meta = dict(
        cur.execute(
            "SELECT k, v FROM meta WHERE k IN ('trainer_step', 'policy', 'done', 'paused')"
        ).fetchall()
    )
    return {
        "step": int(meta["trainer_step"]) if "trainer_step" in meta else None,
        "policy": int(meta["policy"]) if "policy" in meta else None,
        "done": meta.get("done") == "1",
        "paused": meta.get("paused") == "1",
    }


def assignment_dict(svc: Service, cur, row) -> dict:
    counter, node, step, policy, seed, groups, max_new, deadline, reissue_of = row
    s = cur.execute("SELECT sampler FROM steps WHERE step = ?", (step,)).fetchone()
    return {
        "step": step,
        "policy_step": policy,
        "counter": counter,
        "seed": seed,
        "groups": groups,
        "max_new_tokens": max_new,
        "deadline": deadline,
        "reissue_of": reissue_of,
        "sampler": json.loads(s[0]) if s else None,  # None: never issued (fails closed)
    }


ASSIGNMENT_COLUMNS = (
    "counter, node, step, policy, seed, groups, max_new_tokens, deadline, reissue_of"
)


def heartbeat(svc: Service, key: str, policy_version: int | None, want_work: bool) -> dict:
    """Record the heartbeat; the answer carries the node's assignment or why it waits."""
    cfg = svc.cfg
    now = svc.clock()
    with svc.db.tx() as cur:
        state = touch(svc, cur, key)
        svc.node_versions[key] = policy_version  # a registered node's: touch refuses others
        run = run_state(svc, cur)
        answer = {
            "state": state,
            "heartbeat_s": cfg.orchestrator.heartbeat_s,
            "step": run["step"],
            "policy": run["policy"],
            "done": run["done"],
            "assignment": None,
            "wait": None,
        }
        if not want_work:
            return answer
        require_worker(cur, key)
        row = cur.execute(
            f"SELECT {ASSIGNMENT_COLUMNS} FROM assignments WHERE node = ? AND state = 'open'"
            " ORDER BY counter LIMIT 1",
            (key,),
        ).fetchone()
        if row is not None and (policy_version is None or policy_version < row[2]):
            # A lost answer, or weights swapped meanwhile: the same assignment (same counter,
            # so the same prompts and seeds), moved to the policy the node now holds. A new
            # counter here would let a node draw fresh prompts until it liked them.
            if row[3] != policy_version and _why_wait(cfg, run, policy_version) is None:
                cur.execute(
                    "UPDATE assignments SET policy = ? WHERE counter = ?", (policy_version, row[0])
                )
                row = (*row[:3], policy_version, *row[4:])
            answer["assignment"] = assignment_dict(svc, cur, row)
            return answer
        if row is not None:
            # The node holds a policy as new as the assignment's step (the trainer moved on
            # while it was away): a file's policy must be older than its step, so a new
            # assignment is issued at the current step. This redraw comes at most once per
            # training step, and the trainer, not the node, decides when.
            cur.execute("UPDATE assignments SET state = 'orphaned' WHERE counter = ?", (row[0],))
        answer["wait"] = _why_wait(cfg, run, policy_version)
        probation = admission.on_probation(svc, cur, key)
        # a file on probation is for its verdict, which comes even when it is late for
        # training (mark_stale). Pipelined, a node on probation gets work only where its
        # file would be fresh, as any node: given work past the queue, most new nodes'
        # first files went stale (36 of 95 in a 32-worker run; 16 of 309 of proven
        # nodes'). Its pace is not counted (a first file's is not its pace): the queue
        # opens at every step, so it is judged soon all the same
        if answer["wait"] is None and cfg.orchestrator.assign == "slack" and not probation:
            newest_usable = max(1, cfg.async_level - cfg.orchestrator.work_slack_steps)
            if run["step"] - policy_version > newest_usable:
                answer["wait"] = "stale-policy"  # its file could only make this batch
        fresh = None  # pipelined: groups that may still be queued fresh for its version
        if answer["wait"] is None and cfg.orchestrator.assign == "pipelined":
            at = queue.queued_for(svc, cur, run, policy_version, None if probation else key)
            if at > cfg.trainer.steps:
                answer["wait"] = "enough-work"  # the run's last step has its work
            elif at - policy_version > cfg.async_level:
                answer["wait"] = "late-for-its-step"  # the work its policy is fresh for is out
            else:  # read only where the node would get work (turns.py)
                fresh = queue.fresh_room(svc, cur, run, policy_version)
        if answer["wait"] is None and admission.cooldown_left(svc, cur, key, now) > 0:
            answer["wait"] = "cooldown"  # it let assignments expire: admission.py
        groups = cfg.worker.groups_per_file
        if answer["wait"] is None:
            oldest = run["step"] - cfg.async_level
            if probation:  # new keys share a small pool of their own
                limit = admission.probation_limit(svc)
            else:
                limit = (
                    cfg.worker.max_pending_groups or cfg.trainer.batch_groups
                ) + cfg.orchestrator.margin_groups
            room = limit - admission.outstanding(svc, cur, oldest, probation) - groups
            svc.asked_work[key] = now
            if room < 0:
                answer["wait"] = "enough-work"
            elif probation and not admission.range_room(svc, cur, key, oldest, groups):
                answer["wait"] = "range-share"  # admission.py: its address range's share
            elif admission.yields_to_faster(svc, cur, key, probation, room, groups, now):
                answer["wait"] = "faster-first"  # admission.py: work is short, faster nodes wait
            elif fresh is not None and turns.yields_to_longer_waiting(
                svc, cur, key, policy_version, fresh, groups, now, run["step"]
            ):
                answer["wait"] = "longer-waiting-first"  # turns.py: fair turns
        if answer["wait"] in turns.WANTING:
            svc.wanting[key] = now  # it would take work the queue had room for
        if answer["wait"] is not None:
            return answer
        svc.wanting.pop(key, None)
        orphan = cur.execute(
            "UPDATE assignments SET state = 'reissued' WHERE counter = (SELECT counter FROM"
            " assignments WHERE state = 'orphaned' AND step >= ? ORDER BY counter LIMIT 1)"
            " AND state = 'orphaned' RETURNING counter",
            (run["step"] - cfg.async_level,),
        ).fetchone()
        counter = cur.execute(
            "UPDATE counters SET value = value + 1 WHERE name = 'assignment' RETURNING value"
        ).fetchone()[0]
        step = run["step"]
        seed = derive_seed(cfg.seed, key, step, counter)
        budget = cur.execute("SELECT budget FROM nodes WHERE key = ?", (key,)).fetchone()[0]
        deadline = now + admission.deadline_s(svc, cur, key, groups, budget)
        cur.execute(
            "INSERT INTO assignments VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, 'open', ?)",
            (counter, key, step, policy_version, seed, groups, budget, now, deadline,
             orphan[0] if orphan else None),
        )  # fmt: skip
        row = cur.execute(
            f"SELECT {ASSIGNMENT_COLUMNS} FROM assignments WHERE counter = ?", (counter,)
        ).fetchone()
        answer["assignment"] = assignment_dict(svc, cur, row)
        return answer


def _why_wait(cfg, run: dict, policy_version: int | None) -> str | None:
    if run["done"]:
        return "done"
    if run["paused"]:
        return "paused"
    if run["step"] is None:
        return "no-trainer"
    if policy_version is None or run["policy"] is None or policy_version > run["policy"]:
        return "unknown-policy"
    if run["step"] - policy_version > cfg.async_level:
        return "stale-policy"
    return None


def grant_upload(svc: Service, key: str, counter: int, size: int, sha256: str) -> dict:
    """A signed URL for the one file of assignment `counter`."""
    o = svc.cfg.orchestrator
    now = svc.clock()
    if size > o.max_file_bytes:
        raise ApiError(413, f"file of {size} bytes is over the {o.max_file_bytes}-byte limit")
    recent = [t for t in svc.upload_times.get(key, []) if t > now - 60.0]
    if len(recent) >= o.uploads_per_minute:
        raise ApiError(
            429,
            f"more than {o.uploads_per_minute} upload URLs in a minute",
            retry_after_s=recent[-o.uploads_per_minute] + 60.0 - now,  # when one frees
        )
    svc.upload_times[key] = recent + [now]
    with svc.db.tx() as cur:
        require_worker(cur, key)
        row = cur.execute(
            "SELECT node, step, policy, seed, groups, state FROM assignments WHERE counter = ?",
            (counter,),
        ).fetchone()
        if row is None or row[0] != key:
            raise ApiError(403, f"assignment {counter} was not issued to this node")
        node, step, policy, seed, groups, state = row
        object_key = rollout_key(Assignment(step, policy, seed, counter), node, groups)
        existing = cur.execute(
            "SELECT sha256, state FROM files WHERE counter = ?", (counter,)
        ).fetchone()
        if existing is not None and (existing[0] != sha256 or existing[1] != "uploading"):
            raise ApiError(409, f"assignment {counter} already has a file")
        if existing is None:
            if state != "open":
                raise ApiError(409, f"assignment {counter} is {state}")
            if cur.execute("SELECT 1 FROM files WHERE sha256 = ?", (sha256,)).fetchone():
                raise ApiError(409, "a file with these bytes was submitted already")
            cur.execute(
                "INSERT INTO files (key, sha256, node, step, policy, counter, groups, size, state,"
                " checked, created, final, void) VALUES (?, ?, ?, ?, ?, ?, ?, ?, 'uploading', 0,"
                " ?, 0, 0)",
                (object_key, sha256, key, step, policy, counter, groups, size, now),
            )
            cur.execute("UPDATE assignments SET state = 'uploading' WHERE counter = ?", (counter,))
        else:
            cur.execute("UPDATE files SET size = ? WHERE counter = ?", (size, counter))
    expires = int(now + o.upload_url_ttl_s)
    url = svc.objects.upload_url(object_key, key, size, sha256, expires)
    headers = svc.objects.upload_headers(sha256)
    return {"key": object_key, "url": url, "expires": expires, "headers": headers}


def submit(svc: Service, key: str, object_key: str, sha256: str) -> dict:
    """Record the uploaded file and draw whether a validator checks it: with
    probability `validator.sample_rate`, always for a suspect node (mismatch.py)."""
    rate = svc.cfg.validator.sample_rate if svc.cfg.validator.enabled else 0.0
    with svc.db.tx() as cur:
        require_worker(cur, key)
        row = cur.execute(
            "SELECT node, sha256, size, state, counter FROM files WHERE key = ?", (object_key,)
        ).fetchone()
        if row is None or row[0] != key:
            raise ApiError(403, "no upload of this key was granted to this node")
        if row[1] != sha256:
            raise ApiError(409, "sha256 differs from the one the upload URL was granted for")
        if row[3] != "uploading":
            return {"state": row[3]}
        wrong = svc.objects.verify(object_key, row[2], sha256)
        if wrong is not None:
            raise ApiError(409, wrong)
        checked = (
            rate >= 1.0
            or secrets.randbelow(1 << 30) < rate * (1 << 30)
            or (rate > 0.0 and is_suspect(cur, key))  # mismatch.py: a suspect is always checked
            or (rate > 0.0 and admission.on_probation(svc, cur, key))  # so is a new key
        )
        if not svc.cfg.validator.enabled:  # no validator to prove anything: a file is a proof
            admission.record_proof(cur, key)
        state = "pending" if checked else "accepted"
        cur.execute(
            "UPDATE files SET state = ?, checked = ?, submitted = ? WHERE key = ?",
            (state, 0, svc.clock(), object_key),
        )
        cur.execute("UPDATE assignments SET state = 'submitted' WHERE counter = ?", (row[4],))
        admission.check_turnaround(svc, cur, key, row[4], svc.clock())
    return {"state": state}


def mark_stale(svc: Service, cur) -> None:
    """Files too old to train (policy before step - async_level) become stale and their
    objects go, but for a file of a node on probation one version older that is still
    on its way to a validator: its verdict is what probation is for, and validators
    hold that version (they keep async_level + 2, validator/loop.py). Judged, it is
    stale (accepted: it counts for the node, not for training) or the node is ejected."""
    run = run_state(svc, cur)
    if run["step"] is None:
        return
    cut = run["step"] - svc.cfg.async_level
    held = [
        k
        for k, node in cur.execute(
            "SELECT key, node FROM files WHERE state IN ('uploading', 'pending') AND policy = ?",
            (cut - 1,),
        ).fetchall()
        if admission.on_probation(svc, cur, node)
    ]
    marks = ", ".join("?" * len(held))
    rows = cur.execute(
        "UPDATE files SET state = 'stale' WHERE state IN (?, ?, ?) AND policy < ?"
        + (f" AND key NOT IN ({marks})" if held else "")
        + " RETURNING key",
        (*ON_THE_WAY, cut, *held),
    ).fetchall()
    for (k,) in rows:
        svc.objects.delete(k)


def servers(svc: Service, cur) -> list[str]:
    """SHARDCAST servers to advertise: configured ones and registered relays that passed
    their check (relaycheck.py); a delisted relay is not registered (relaystanding.py)."""
    urls = [u.rstrip("/") for u in svc.cfg.shardcast.servers]
    for (u,) in cur.execute(
        "SELECT url FROM nodes WHERE role = 'relay' AND state IN ('registered', 'healthy')"
        " AND url IN (SELECT url FROM relay_checks WHERE listed = 1) ORDER BY registered"
    ).fetchall():
        if u.rstrip("/") not in urls:
            urls.append(u.rstrip("/"))
    return urls


def ledger(svc: Service) -> dict:
    """Every node with its state, stake, file counts (accepted, rejected and of those
    blameless, pending, stale, void, final), suspect flag and mean mismatch KL
    over the window ending at the last step the trainer reported (unchecked and checked
    files, None without tokens); `mismatch`: that window and its reference KL."""
    with svc.db.read() as cur:
        nodes = cur.execute(
            "SELECT key, role, state, stake, slashed, reason, last_seen, hardware FROM nodes"
            " ORDER BY registered"
        ).fetchall()
        devices = dict(
            cur.execute("SELECT k, v FROM meta WHERE k LIKE ?", ("device:%",)).fetchall()
        )
        blameless = ", ".join(f"'{c}'" for c in (*BLAMELESS_CHECKS, "trainer"))
        per = cur.execute(
            f"SELECT node, state, void, final, COALESCE(check_name IN ({blameless}), FALSE),"
            " COUNT(*) FROM files GROUP BY node, state, void, final, 5"
        ).fetchall()
        run = run_state(svc, cur)
        suspects = {k for (k,) in cur.execute("SELECT node FROM suspects").fetchall()}
        last = svc.meta("mismatch_step", cur)
        window = svc.cfg.validator.mismatch_window
        figures = window_figures(cur, int(last), window) if last is not None else []
    kl = {m.node: m for m in figures}
    zero = {"accepted": 0, "rejected": 0, "blameless": 0, "pending": 0, "stale": 0, "void": 0,
            "final": 0}  # fmt: skip
    counts: dict[str, dict[str, int]] = {}
    for node, state, void, final, no_fault, n in per:
        c = counts.setdefault(node, dict(zero))
        if void:
            c["void"] += n
        elif state in ("accepted", "consumed", "trained"):
            c["accepted"] += n
        elif state == "rejected":
            c["rejected"] += n
            c["blameless"] += n if no_fault else 0
        elif state in ("pending", "uploading"):
            c["pending"] += n
        elif state in ("stale", "discarded"):  # discarded: stale, its object deleted
            c["stale"] += n
        if final:
            c["final"] += n
    out = []
    for key, role, state, stake, slashed, reason, last_seen, hardware in nodes:
        c = counts.get(key, zero)
        m = kl.get(key)
        device = stored_object(hardware).get("device", "")
        out.append(
            {"key": key, "role": role, "state": state, "stake": stake, "slashed": slashed,
             "reason": reason, "last_seen": last_seen, **c, "suspect": key in suspects,
             "device": device,
             "kl_unchecked": m.unchecked_kl if m else None,
             "kl_checked": m.checked_kl if m else None}
        )  # fmt: skip
    steps = None if last is None else [max(0, int(last) - window + 1), int(last)]
    mismatch = {"steps": steps, "reference": reference_kl(figures)}
    where = {
        "trainer": devices.get("device:trainer", ""),
        "validators": {
            k.removeprefix("device:"): v
            for k, v in sorted(devices.items())
            if k != "device:trainer"
        },
    }
    return {"run_id": svc.run_id, "run": run, "mismatch": mismatch, "devices": where,
            "nodes": out}  # fmt: skip
