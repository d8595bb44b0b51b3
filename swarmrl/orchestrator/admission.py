"""Admission: what a worker key gets before it has proved anything, and what holding
work without doing it costs.

A key is free and its hardware report is its own word, so a new worker starts on
probation until `orchestrator.probation_files` of its files were accepted by a
validator (every file once validation is off):

- each of its files is validated, whatever `validator.sample_rate` (a measured
  proof of compute with the run's model: a lazy or cheating key is caught before
  any of its files is trained on unchecked);
- all keys on probation together hold at most `orchestrator.probation_groups`
  groups (default: one step's worth, `trainer.batch_groups`, at least one
  file), apart from the capacity of proven workers. A flood of new keys
  competes for that pool only: it cannot take the work of proven workers. The
  pool comes on top of the run's capacity, so up to twice the groups the
  trainer needs may be out while new keys work (a file that comes too late
  goes stale). With a pool of one file, 2 honest newcomers among 8 hoarding
  keys made 14% of what they make alone (the admission test's simulation).
  (An assignment always holds `worker.groups_per_file` groups: workers and
  validators build and check files of that size.)

Keys the operator lists in `orchestrator.trusted_workers` (the launcher's own
workers) skip probation.

Each worker has a pace: seconds per group and new token from assignment to
submission, an average over its recent files that starts from what its reported
speed claims; an expired or abandoned assignment counts as a file that took that
long. Two rules use it:

- the deadline of an assignment is `assignment_slack` times what the node needs
  by its claim, or by its pace if that is faster, within [`min_assignment_s`,
  `assignment_s`]: proving faster shortens a node's deadlines, submitting late
  never lengthens them (a node that reports no speed gets the shortest);
- when work is short, faster nodes go first (`yields_to_faster`): a node takes
  an assignment only if a file's worth of room stays free for each worker of its
  pool whose measured pace is `prefer_faster` times its own or better and that is
  waiting for work. Only measured paces reserve room, so a claim ranks its maker
  below others, never above.

A node whose assignment expires (or that goes silent holding one, or submits after
the deadline plus `late_grace_s`) waits `min_assignment_s · 2^(k−1)` after its k-th
lapse before it gets another (at most `assignment_s`); each file on time takes one
lapse off. The operator's `trusted_workers` get the flat `assignment_s` and no
waits, but are ranked by pace like everyone.

Measured (the admission test's simulation: 2 honest workers, 8 hoarding keys, the
groups trained after the hoarders' first assignments expired): hoarders that never
submit get 0% of them; hoarders that submit just before their deadlines get 13%
(44% without the faster-first rule); hoarders that claim a low speed for 600 s
deadlines get 3% (100% without it).

Shares per address range (ranges.py: an IPv4 /24, an IPv6 /48): the keys of one
range take at most `range_share` of the faucet (of its burst, and of its rate) and
hold at most `range_share` of the probation pool (at least one file), so that keys
from one range, however many, leave the rest to newcomers from other ranges: an
honest newcomer from another range gets a stake and work at once while one
range's sybils hold their share.

The proof of work is priced in seconds of one core (`register_work_s`): the
orchestrator measures at its first start how fast one core of its machine hashes,
and keeps the bits it chose in its database (`proof_bits`).

Blameless refusals (a file refused as `unverifiable` or by the trainer) count
against their node and can send it back to probation: judgement.py.

What this does not stop: an attacker with many address ranges holds a share of
the faucet and the probation pool in each, and so can still fill them; an honest
slow node gets only what faster nodes leave when work is short; the stake is
still a ledger number. See docs/threat-model.md.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import secrets

from swarmrl.orchestrator.service import ApiError, Service
from swarmrl.protocol import work_proof

log = logging.getLogger("swarmrl.orchestrator")


def admit(
    svc: Service, cur, node: str, role: str, work: str, invite: str, now: float, net: str = ""
) -> float:
    """What a new key pays to register, and the stake it gets (ApiError if it cannot pay).

    - the operator's `trusted_workers`: nothing; the stake is the operator's;
    - with an invitation (`issue_invites`): the invitation, used up; its stake;
    - otherwise a proof of work of `svc.work_bits` bits (protocol/work_proof.py,
      `proof_bits`), and a worker takes one stake from the faucet, which refills at
      `faucet_per_hour` up to `faucet_burst`, of which its address range `net` may
      take `range_share`; when either is empty the key is told when to retry (429),
      and when the operator closed the faucet (burst 0) that only an invitation
      admits it (403). A relay holds no stake."""
    o = svc.cfg.orchestrator
    if node in o.trusted_workers:
        return o.stake if role == "worker" else 0.0
    if invite:
        row = cur.execute(
            "UPDATE invites SET used_by = ?, used = ? WHERE hash = ? AND used_by IS NULL"
            " RETURNING stake",
            (node, now, _invite_hash(invite)),
        ).fetchone()
        if row is None:
            raise ApiError(403, "unknown or used invitation")
        return float(row[0]) if role == "worker" else 0.0
    if not work_proof.check(svc.run_id, node, work, svc.work_bits):
        raise ApiError(
            403,
            f"a new key registers with a proof of work of {svc.work_bits} bits"
            " (the 'work' field: swarmrl/protocol/work_proof.py) or an invitation",
        )
    if role != "worker":
        return 0.0
    _take_from_faucet(svc, cur, now, net)
    return o.stake


def proof_bits(svc: Service) -> int:
    """The proof of work of this run: `register_work_bits` if set, else the bits one core
    here needs `register_work_s` for on average, measured at the first start with this
    setting and kept in the database (restarts and replicas agree)."""
    o = svc.cfg.orchestrator
    if o.register_work_bits is not None:
        return o.register_work_bits
    name = f"register_work_bits:{o.register_work_s:g}"
    kept = svc.meta(name)
    if kept is None:
        rate = work_proof.hashes_per_second()
        bits = work_proof.bits_for(o.register_work_s, rate)
        kept = svc.set_meta_once(name, str(bits))
        log.info(
            "proof of work: %s bits, %.1f s of one core here (%.2g hashes/s measured; "
            "orchestrator.register_work_s = %g)",
            kept, (1 << int(kept)) / rate, rate, o.register_work_s,
        )  # fmt: skip
    return int(kept)


def _bucket(level: float, since: float, now: float, burst: float, per_hour: float) -> float:
    return min(burst, level + max(0.0, now - since) * per_hour / 3600)


def _take_from_faucet(svc: Service, cur, now: float, net: str) -> None:
    o = svc.cfg.orchestrator
    if o.faucet_burst == 0:
        raise ApiError(403, "this run admits new workers by invitation only")
    svc.db.serialize(cur, "faucet")  # its level is read, then written
    meta = dict(
        cur.execute("SELECT k, v FROM meta WHERE k IN ('faucet', 'faucet_time')").fetchall()
    )
    level = _bucket(
        float(meta.get("faucet", o.faucet_burst)), float(meta.get("faucet_time", now)), now,
        o.faucet_burst, o.faucet_per_hour,
    )  # fmt: skip
    if level < 1.0:
        _empty(
            o.faucet_per_hour, level, f"the run admits {o.faucet_per_hour:g} new workers an hour"
        )
    if o.range_share < 1.0 and net:  # '': no peer address (a Unix socket): no range
        burst, per_hour = range_faucet(svc)
        row = cur.execute("SELECT level, time FROM faucets WHERE net = ?", (net,)).fetchone()
        mine = burst if row is None else _bucket(row[0], row[1], now, burst, per_hour)
        if mine < 1.0:
            _empty(
                per_hour, mine,
                f"address range {net} has taken its share of the faucet ({burst:g} at once,"
                f" {per_hour:g} an hour)",
            )  # fmt: skip
        cur.execute(
            "INSERT INTO faucets VALUES (?, ?, ?) ON CONFLICT (net) DO UPDATE"
            " SET level = excluded.level, time = excluded.time",
            (net, mine - 1.0, now),
        )
    svc.set_meta(cur, "faucet", repr(level - 1.0))
    svc.set_meta(cur, "faucet_time", repr(now))


def range_faucet(svc: Service) -> tuple[float, float]:
    """One address range's share of the faucet: (burst, stakes an hour)."""
    o = svc.cfg.orchestrator
    return max(1.0, math.floor(o.range_share * o.faucet_burst)), o.range_share * o.faucet_per_hour


def _empty(per_hour: float, level: float, what: str) -> None:
    if per_hour <= 0.0:
        raise ApiError(403, f"{what}, and the faucet is spent; new workers need an invitation")
    wait = (1.0 - level) * 3600 / per_hour
    raise ApiError(
        429,
        f"{what} and the faucet is empty: retry in {wait:.0f} s, or register with an invitation",
        retry_after_s=wait,
    )


def forget_full_faucets(svc: Service, cur, now: float) -> None:
    """Drop the rows of ranges whose faucet has refilled (a full faucet is the default)."""
    burst, per_hour = range_faucet(svc)
    if per_hour > 0.0:
        cur.execute(
            "DELETE FROM faucets WHERE time < ? - (? - level) * 3600.0 / ?",
            (now, burst, per_hour),
        )


def issue_invites(svc: Service, count: int, stake: float) -> list[str]:
    """`count` new invitations (only their hashes are stored)."""
    tokens = [secrets.token_urlsafe(24) for _ in range(count)]
    now = svc.clock()
    with svc.db.tx() as cur:
        for t in tokens:
            cur.execute(
                "INSERT INTO invites (hash, stake, issued) VALUES (?, ?, ?)",
                (_invite_hash(t), stake, now),
            )
    return tokens


def _invite_hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def proven(cur, node: str) -> int:
    row = cur.execute("SELECT proven FROM standing WHERE node = ?", (node,)).fetchone()
    return int(row[0]) if row else 0


def on_probation(svc: Service, cur, node: str) -> bool:
    o = svc.cfg.orchestrator
    if node in o.trusted_workers:
        return False
    return proven(cur, node) < o.probation_files


def record_proof(cur, node: str) -> None:
    """One more accepted file of `node` (a validator's acceptance, or any with validation off)."""
    cur.execute(
        "INSERT INTO standing (node, proven, expired, last_expired) VALUES (?, 1, 0, 0)"
        " ON CONFLICT (node) DO UPDATE"
        " SET proven = standing.proven + 1",
        (node,),
    )


def record_expiry(cur, node: str, now: float) -> None:
    """One more lapse of `node`: an assignment expired, abandoned, or submitted late."""
    cur.execute(
        "INSERT INTO standing (node, proven, expired, last_expired) VALUES (?, 0, 1, ?)"
        " ON CONFLICT (node) DO UPDATE"
        " SET expired = standing.expired + 1, last_expired = excluded.last_expired",
        (node, now),
    )


def cooldown_left(svc: Service, cur, node: str, now: float) -> float:
    """Seconds before `node` may take new work after letting assignments expire."""
    if node in svc.cfg.orchestrator.trusted_workers:
        return 0.0
    row = cur.execute(
        "SELECT expired, last_expired FROM standing WHERE node = ?", (node,)
    ).fetchone()
    if not row or not row[0]:
        return 0.0
    o = svc.cfg.orchestrator
    wait = min(o.assignment_s, o.min_assignment_s * 2.0 ** min(int(row[0]) - 1, 30))
    return max(0.0, float(row[1]) + wait - now)


def deadline_s(svc: Service, cur, node: str, groups: int, budget: int) -> float:
    """Seconds `node` gets for an assignment of `groups` groups at `budget` new tokens:
    `assignment_slack` times what its reported speed needs, or its measured pace if that
    is faster, within bounds (the operator's trusted workers: `assignment_s`). Submitting
    late never lengthens a node's deadlines: a slow measured pace costs it priority
    instead (`yields_to_faster`)."""
    o = svc.cfg.orchestrator
    if node in o.trusted_workers:
        return o.assignment_s
    needed = _generation_s(svc, cur, node, groups, budget)
    pace = measured_pace(cur, node)
    if pace is not None:  # measured faster than it said: a shorter deadline; never longer
        needed = min(needed, pace * groups * budget)
    return min(o.assignment_s, max(o.min_assignment_s, o.assignment_slack * needed))


PACE_WEIGHT = 0.5  # weight of a node's newest file in its measured pace


def measured_pace(cur, node: str) -> float | None:
    """Seconds per group and new token from assignment to submission: an average that
    follows the node's recent files, starting from what its reported speed claims
    (None for a node that reported no speed and has submitted nothing)."""
    row = cur.execute("SELECT s_per_unit FROM pace WHERE node = ?", (node,)).fetchone()
    return float(row[0]) if row else None


def record_claim(svc: Service, cur, node: str, tokens_per_s: float) -> None:
    """A worker's pace before its first file: what its reported speed claims."""
    if tokens_per_s > 0.0:
        cur.execute(
            "INSERT INTO pace VALUES (?, ?, 0) ON CONFLICT (node) DO UPDATE"
            " SET s_per_unit = excluded.s_per_unit WHERE pace.files = 0",
            (node, svc.cfg.worker.group_size / tokens_per_s),
        )


def record_pace(cur, node: str, counter: int, now: float) -> None:
    row = cur.execute(
        "SELECT issued, groups, max_new_tokens FROM assignments WHERE counter = ?", (counter,)
    ).fetchone()
    if row is None:
        return
    pace = max(0.0, now - float(row[0])) / max(1, int(row[1]) * int(row[2]))
    cur.execute(
        "INSERT INTO pace VALUES (?, ?, 1) ON CONFLICT (node) DO UPDATE SET s_per_unit ="
        " pace.s_per_unit + ? * (excluded.s_per_unit - pace.s_per_unit), files = pace.files + 1",
        (node, pace, PACE_WEIGHT),
    )


def yields_to_faster(
    svc: Service, cur, node: str, probation: bool, room: int, groups: int, now: float
) -> bool:
    """Whether `node` must leave the `room` left after its assignment to faster nodes:
    workers of its pool (on probation, or proven) whose measured pace is
    `prefer_faster` times `node`'s or better (a claim ranks its maker below others, never
    above: only measured paces reserve room), that asked for work within two heartbeats
    and hold none now.
    It takes the work only if a file's worth of groups stays free for each of them.

    This makes slow holding unprofitable. A key that sits on each assignment until
    its deadline is slow by measurement, and one that claims a low speed to get long
    deadlines is slow by its own word: when work is short, either gets only what
    faster workers leave (the admission test's hoarders). An honest slow node is
    treated the same way: its files would arrive staler than those of the nodes it
    yields to. Who asked is kept in this process's memory (`Service.asked_work`): with
    several replicas behind one address, each knows the askers it served."""
    o = svc.cfg.orchestrator
    mine = measured_pace(cur, node)
    if mine is None or not mine > 0.0:
        return False  # no pace known (or as fast as can be): no one goes before it
    since = now - 2.0 * o.heartbeat_s
    asking = {k for k, t in svc.asked_work.copy().items() if t >= since and k != node}
    if not asking:
        return False
    trusted = list(o.trusted_workers)
    marks = ", ".join("?" for _ in trusted) or "''"
    pool = (
        f"COALESCE(s.proven, 0) < ? AND p.node NOT IN ({marks})"
        if probation
        else f"(COALESCE(s.proven, 0) >= ? OR p.node IN ({marks}))"
    )
    faster = cur.execute(
        "SELECT p.node FROM pace p LEFT JOIN standing s ON s.node = p.node"
        " WHERE p.files > 0 AND p.s_per_unit * ? < ? AND " + pool,
        (o.prefer_faster, mine, o.probation_files, *trusted),
    ).fetchall()
    waiting = [k for (k,) in faster if k in asking]
    if not waiting or room >= groups * len(waiting):
        return False
    marks = ", ".join("?" for _ in waiting)
    busy = cur.execute(
        f"SELECT COUNT(DISTINCT node) FROM assignments WHERE state = 'open' AND node IN ({marks})",
        waiting,
    ).fetchone()[0]
    return room < groups * (len(waiting) - int(busy))


def check_turnaround(svc: Service, cur, node: str, counter: int, now: float) -> None:
    """A file submitted after its assignment's deadline plus `late_grace_s` counts as an
    expiry (the assignment may already be reissued); one on time takes one expiry off
    the node's count, so an honest node's old lapses fade."""
    row = cur.execute("SELECT deadline FROM assignments WHERE counter = ?", (counter,)).fetchone()
    if row is None:
        return
    record_pace(cur, node, counter, now)
    if node in svc.cfg.orchestrator.trusted_workers:
        return
    if now > float(row[0]) + svc.cfg.orchestrator.late_grace_s:
        record_expiry(cur, node, now)
    else:
        cur.execute(
            "UPDATE standing SET expired = expired - 1 WHERE node = ? AND expired > 0", (node,)
        )


def _generation_s(svc: Service, cur, node: str, groups: int, budget: int) -> float:
    """Seconds the node's reported speed needs to generate `groups` groups (0 when it
    reports none: a node that does not say how fast it is gets the shortest deadline)."""
    row = cur.execute("SELECT hardware FROM nodes WHERE key = ?", (node,)).fetchone()
    tps = float(json.loads(row[0]).get("tokens_per_s", 0.0)) if row and row[0] else 0.0
    if tps <= 0.0:
        return 0.0
    return groups * svc.cfg.worker.group_size * budget / tps


def probation_limit(svc: Service) -> int:
    cfg = svc.cfg
    return cfg.orchestrator.probation_groups or max(
        cfg.trainer.batch_groups, cfg.worker.groups_per_file
    )


def outstanding(
    svc: Service, cur, oldest_policy: int, probation: bool, net: str | None = None
) -> int:
    """Groups out (open assignments, files on their way with a fresh policy) of the
    nodes on probation (`probation`) or of the others; with `net`, of that address
    range's nodes only."""
    o = svc.cfg.orchestrator
    trusted = list(o.trusted_workers)
    marks = ", ".join("?" for _ in trusted) or "''"
    # a node is on probation when it is not trusted and has fewer proofs than required
    cond = (
        f"COALESCE(n.proven, 0) < ? AND {{col}} NOT IN ({marks})"
        if probation
        else f"(COALESCE(n.proven, 0) >= ? OR {{col}} IN ({marks}))"
    )
    within = " AND {col} IN (SELECT key FROM nodes WHERE net = ?)" if net is not None else ""
    extra = (net,) if net is not None else ()
    a = cur.execute(
        "SELECT COALESCE(SUM(a.groups), 0) FROM assignments a"
        " LEFT JOIN standing n ON n.node = a.node WHERE a.state = 'open' AND a.policy >= ?"
        " AND " + (cond + within).format(col="a.node"),
        (oldest_policy, o.probation_files, *trusted, *extra),
    ).fetchone()[0]
    f = cur.execute(
        "SELECT COALESCE(SUM(f.groups), 0) FROM files f LEFT JOIN standing n ON n.node = f.node"
        " WHERE f.state IN ('uploading', 'pending', 'accepted') AND f.void = 0"
        " AND f.policy >= ? AND " + (cond + within).format(col="f.node"),
        (oldest_policy, o.probation_files, *trusted, *extra),
    ).fetchone()[0]
    return int(a) + int(f)


def range_room(svc: Service, cur, node: str, oldest_policy: int, groups: int) -> bool:
    """Whether a node on probation may take `groups` more groups of the probation pool
    within its address range's share: `range_share` of the pool, at least one file."""
    cfg = svc.cfg
    if cfg.orchestrator.range_share >= 1.0:
        return True
    svc.db.serialize(cur, "probation")  # held to the assignment's commit: one count at a time
    row = cur.execute("SELECT net FROM nodes WHERE key = ?", (node,)).fetchone()
    if row is None or not row[0]:
        return True  # no peer address when it registered: no range to share with
    share = max(
        cfg.worker.groups_per_file,
        math.floor(cfg.orchestrator.range_share * probation_limit(svc)),
    )
    held = outstanding(svc, cur, oldest_policy, True, row[0])
    return held + groups <= share
