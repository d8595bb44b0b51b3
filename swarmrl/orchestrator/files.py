"""After upload: validation, the trainer's queue, and finality.

A submitted file is claimed by one validator at a time (a lease of
`validation_lease_s`: a validator that dies loses it), judged, and its
signed verdict recorded: accepted files wait for the trainer, a rejection
ejects and slashes the node (orchestrator/nodes.py `punish`). The trainer
opens steps, lists the accepted files of a step, marks the ones it uses
consumed, and announces published versions; on resume the files consumed
after the resumed version go back. Contributions become final after the
validity window. The states are described in orchestrator/work.py.
"""

from __future__ import annotations

import json

from swarmrl.orchestrator.admission import record_proof
from swarmrl.orchestrator.judgement import record_judgement
from swarmrl.orchestrator.mismatch import recheck_unconsumed
from swarmrl.orchestrator.nodes import event, punish
from swarmrl.orchestrator.service import ApiError, Service
from swarmrl.orchestrator.work import (
    ASSIGNMENT_COLUMNS,
    assignment_dict,
    mark_stale,
    run_state,
)
from swarmrl.protocol.identity import verify


def discard_stale(svc: Service) -> int:
    """Delete the objects of stale files once no upload URL for them can still be valid
    (an upload may land after its file was marked stale)."""
    horizon = svc.clock() - svc.cfg.orchestrator.upload_url_ttl_s - 60.0
    with svc.db.tx() as cur:
        rows = cur.execute(
            "UPDATE files SET state = 'discarded' WHERE state = 'stale' AND created < ?"
            " RETURNING key",
            (horizon,),
        ).fetchall()
    for (k,) in rows:
        svc.objects.delete(k)
    return len(rows)


def claim_file(svc: Service, validator: str, max_policy: int, device: str = "") -> dict:
    """The next pending file whose policy this validator holds (at most
    `max_policy`), held for it for `validation_lease_s`. `device`: where the
    validator computes, kept for the ledger (written only when it changes)."""
    now = svc.clock()
    with svc.db.tx() as cur:
        if device and svc.meta(f"device:{validator}", cur) != device:
            svc.set_meta(cur, f"device:{validator}", device)
        mark_stale(svc, cur)
        run = run_state(svc, cur)
        published = min(run["policy"] if run["policy"] is not None else -1, max_policy)
        row = cur.execute(
            "UPDATE files SET validator = ?, lease = ? WHERE key = (SELECT key FROM files"
            " WHERE state = 'pending' AND void = 0 AND policy <= ? AND (lease IS NULL OR lease < ?)"
            " ORDER BY policy, key LIMIT 1) AND state = 'pending' AND (lease IS NULL OR lease < ?)"
            " RETURNING key, sha256, node, step, policy, counter, size",
            (validator, now + svc.cfg.orchestrator.validation_lease_s, published, now, now),
        ).fetchone()
        answer = {"file": None, "trainer_step": run["step"], "done": run["done"]}
        if row is None:
            return answer
        key, sha, node, step, policy, counter, size = row
        a = cur.execute(
            f"SELECT {ASSIGNMENT_COLUMNS} FROM assignments WHERE counter = ?", (counter,)
        ).fetchone()
        assignment = assignment_dict(svc, cur, a)
    expires = int(now + svc.cfg.orchestrator.validation_lease_s)
    answer["file"] = {
        "key": key,
        "sha256": sha,
        "node": node,
        "size": size,
        "url": svc.objects.download_url(key, expires),
        "assignment": assignment,
    }
    return answer


def record_verdict(svc: Service, validator: str, verdict: dict) -> dict:
    from swarmrl.protocol.verdict import BLAMELESS_CHECKS, Verdict

    try:
        v = Verdict(**verdict)
    except TypeError as e:
        raise ApiError(422, f"not a verdict: {e}") from None
    if v.validator != validator or not verify(v.validator, v.payload(), v.signature):
        raise ApiError(403, "the verdict is not signed by the calling validator")
    with svc.db.tx() as cur:
        row = cur.execute(
            "SELECT sha256, node, state, validator, void, policy FROM files WHERE key = ?",
            (v.key,),
        ).fetchone()
        if row is None:
            raise ApiError(404, f"no file {v.key!r}")
        sha, node, state, holder, void, policy = row
        if sha != v.sha256 or node != v.node:
            raise ApiError(409, "the verdict names other bytes or another node than the file")
        late_cheat = (  # found out after the trainer moved past the file: still a cheat
            state in ("stale", "discarded") and holder == validator and not v.accepted
            and v.check not in BLAMELESS_CHECKS
        )  # fmt: skip
        if state != "pending" and not late_cheat:
            return {"state": state}
        if holder != validator:
            raise ApiError(409, "this file is held by another validator")
        if late_cheat:
            return {"state": state, "ejected": _eject(svc, cur, node, v)}
        blob = json.dumps(verdict, sort_keys=True)
        if v.accepted:
            cur.execute(
                "UPDATE files SET state = 'accepted', checked = 1, verdict = ? WHERE key = ?",
                (blob, v.key),
            )
            record_proof(cur, node)  # admission.py: a step out of probation
            record_judgement(svc, cur, node, False, svc.clock())
            return {"state": "accepted"}
        cur.execute(
            "UPDATE files SET state = 'rejected', checked = 1, verdict = ?, check_name = ?,"
            " reason = ? WHERE key = ?",
            (blob, v.check, v.reason[:1000], v.key),
        )
        # the validator's own failure or doubt (BLAMELESS_CHECKS): refused, no one punished,
        # and counted: a node whose files are refused without blame far more often than
        # the swarm's goes back to probation (judgement.py), so that such files are no
        # free work for an attacker who found a way to make them
        if v.check in BLAMELESS_CHECKS:
            ejected = False
            record_judgement(svc, cur, node, True, svc.clock())
        else:
            ejected = _eject(svc, cur, node, v)
    _purge_late(svc, v.key, policy)
    return {"state": "rejected", "ejected": ejected}


def _purge_late(svc: Service, key: str, policy: int) -> None:
    """A file rejected after `published` selected the rejected files of its policy
    for deletion: its object goes now (the record stays). On PostgreSQL a rejection
    that commits between that select and its commit can still miss both (the window
    is one short transaction): its object stays behind."""
    if policy <= int(svc.meta("purged_rejected") or -1):
        svc.objects.delete(key)


def _eject(svc: Service, cur, node: str, v) -> bool:
    """Eject and slash the node a rejecting verdict caught, unless it already was."""
    nstate = cur.execute("SELECT state FROM nodes WHERE key = ?", (node,)).fetchone()
    if nstate is None or nstate[0] in ("ejected", "banned"):
        return False
    punish(svc, cur, node, "ejected", f"{v.check}: {v.reason}", slash=True)
    return True


def open_step(svc: Service, step: int, sampler: dict, done: bool, device: str = "") -> dict:
    """Step `step` is open with the curriculum's `sampler` state (`done`: the run is
    over); `device`: where the trainer computes, kept for the ledger."""
    keep = 2 * svc.cfg.async_level + 4
    with svc.db.tx() as cur:
        if device:
            svc.set_meta(cur, "device:trainer", device)
        cur.execute(
            "INSERT INTO steps VALUES (?, ?, ?) ON CONFLICT (step) DO UPDATE SET"
            " sampler = excluded.sampler, opened = excluded.opened",
            (step, json.dumps(sampler, sort_keys=True), svc.clock()),
        )
        cur.execute("DELETE FROM steps WHERE step < ?", (step - keep,))
        svc.set_meta(cur, "trainer_step", str(step))
        if done:
            svc.set_meta(cur, "done", "1")
        mark_stale(svc, cur)
    return {"step": step}


def published(svc: Service, version: int) -> dict:
    """Version `version` is out: files the trainer consumed up to it are trained, and
    their objects are deleted once `orchestrator.keep_trained_steps` more versions are
    out (the dashboard's rollout viewer reads them until then); so are the objects of
    rejected files generated with a policy that old (their records, verdict and
    reason included, stay in the ledger)."""
    upto = version - svc.cfg.orchestrator.keep_trained_steps
    with svc.db.tx() as cur:
        svc.set_meta(cur, "policy", str(version))
        trained = cur.execute(
            "UPDATE files SET state = 'trained' WHERE state = 'consumed' AND consumed_step <= ?",
            (version,),
        ).rowcount
        # `purged`: every trained file consumed up to it is deleted. It moves only after
        # the deletes succeed, and never back (a resume, a lost or repeated announce).
        purged = int(svc.meta("purged", cur) or -1)
        rows = cur.execute(
            "SELECT key FROM files WHERE state = 'trained' AND consumed_step > ?"
            " AND consumed_step <= ?",
            (purged, upto),
        ).fetchall()
        # `purged_rejected` moves in the same transaction as the select: a rejection
        # committed after it finds the new mark (`_purge_late`) and deletes its own object
        # (a crash before the deletes below leaves these objects behind: only bytes)
        purged_rejected = int(svc.meta("purged_rejected", cur) or -1)
        rows += cur.execute(
            "SELECT key FROM files WHERE state = 'rejected' AND policy > ? AND policy <= ?",
            (purged_rejected, upto),
        ).fetchall()
        if upto > purged_rejected:
            svc.set_meta(cur, "purged_rejected", str(upto))
    svc.published_at[version] = svc.clock()  # the newest 4096 (the dashboard's weights lag)
    for (k,) in rows:
        svc.objects.delete(k)
    if upto > purged:
        with svc.db.tx() as cur:
            if upto > int(svc.meta("purged", cur) or -1):
                svc.set_meta(cur, "purged", str(upto))
    return {"policy": version, "trained": trained}


def trainer_files(svc: Service, step: int) -> dict:
    """Accepted files the trainer may take for `step`, the oldest policy first (the
    first to go stale; queue.queued_for counts on it), then by key."""
    now = svc.clock()
    expires = int(now + 600)
    with svc.db.tx() as cur:
        mark_stale(svc, cur)
        rows = cur.execute(
            "SELECT key, sha256, node, policy, verdict, checked FROM files WHERE state = 'accepted'"
            " AND void = 0 AND policy >= ? ORDER BY policy, key",
            (step - svc.cfg.async_level,),
        ).fetchall()
        counts = dict(cur.execute("SELECT state, COUNT(*) FROM files GROUP BY state").fetchall())
        stopped = svc.meta("stopped", cur) == "1"
    files = [
        {
            "key": k,
            "sha256": sha,
            "node": node,
            "policy_step": policy,
            "verdict": json.loads(verdict) if verdict else None,
            "checked": bool(checked),
            "url": svc.objects.download_url(k, expires),
        }
        for k, sha, node, policy, verdict, checked in rows
    ]
    return {"files": files, "counts": counts, "stopped": stopped}


def consume(svc: Service, step: int, keys: list[str]) -> dict:
    taken = []
    with svc.db.tx() as cur:
        for k in keys:
            n = cur.execute(
                "UPDATE files SET state = 'consumed', consumed_step = ? WHERE key = ?"
                " AND state = 'accepted' AND void = 0",
                (step, k),
            ).rowcount
            if n:
                taken.append(k)
    return {"consumed": taken}


def trainer_reject(svc: Service, key: str, reason: str) -> dict:
    with svc.db.tx() as cur:
        row = cur.execute(
            "UPDATE files SET state = 'rejected', check_name = 'trainer', reason = ?"
            " WHERE key = ? AND state IN ('accepted', 'consumed') RETURNING policy, node",
            (reason[:1000], key),
        ).fetchone()
        if row is not None:  # no one is blamed, and it counts as a blameless refusal
            record_judgement(svc, cur, row[1], True, svc.clock())
    if row is not None:
        _purge_late(svc, key, row[0])
    return {"rejected": row is not None}


def resume(svc: Service, version: int) -> dict:
    """The trainer restarts after `version`: files consumed by later steps go back (those
    of suspect nodes that were not checked, to validation: mismatch.py)."""
    with svc.db.tx() as cur:
        n = cur.execute(
            "UPDATE files SET state = 'accepted', consumed_step = NULL WHERE state = 'consumed'"
            " AND consumed_step > ?",
            (version,),
        ).rowcount
        recheck_unconsumed(svc, cur)
        cur.execute("DELETE FROM run_metrics WHERE step > ?", (version,))
        svc.set_meta(cur, "policy", str(version))
        cur.execute("DELETE FROM meta WHERE k IN ('done', 'stopped')")
    return {"returned": n}


def finalize(svc: Service) -> int:
    """Contributions older than the validity window become final (cannot be voided)."""
    now = svc.clock()
    with svc.db.tx() as cur:
        rows = cur.execute(
            "UPDATE files SET final = 1 WHERE final = 0 AND void = 0 AND state IN"
            " ('accepted', 'consumed', 'trained') AND submitted < ? RETURNING node",
            (now - svc.cfg.orchestrator.validity_window_s,),
        ).fetchall()
        per: dict[str, int] = {}
        for (node,) in rows:
            per[node] = per.get(node, 0) + 1
        for node, n in per.items():
            event(cur, now, node, "final", float(n), f"{n} files final")
    return len(rows)
