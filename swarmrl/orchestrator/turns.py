"""Turns when the queue is short (orchestrator/work.py): room for a version goes to
the nodes starved of work before a node that just had some."""

from __future__ import annotations

from swarmrl.orchestrator.service import Service

# the answers of a node that would take work the queue had room for (work.heartbeat)
WANTING = ("late-for-its-step", "stale-policy", "longer-waiting-first")
# steps without an assignment after which a node turned away for room goes first
STARVED_STEPS = 4


def yields_to_longer_waiting(
    svc: Service, cur, node: str, policy: int, fresh: int, groups: int, now: float, step: int
) -> bool:
    """Whether `node` must leave the `fresh` groups the queue still has for its version
    (queue.fresh_room) to nodes that have waited longer for work: nodes that asked
    within two heartbeats and were turned away for want of room (`Service.wanting`),
    hold `policy` or the version before it (a node that fetches versions later than
    others holds the older one when the newer one's room opens, and would lose every
    race), hold no assignment, had none for a step `STARVED_STEPS` or more before the
    open `step` (or none ever), and whose last assignment was issued before `node`'s
    (never: since they registered). It takes the work only if a file's worth stays
    free for each. A node that cannot fetch the newer version keeps room for one
    version at most.

    Without it the queue goes to whoever asks first once a version is out: the nodes
    that fetch versions soonest, or that just handed in a file and ask at once, while
    a node turned away asks less and less often (inference/pacing.py). With 32
    workers where a step takes 8 or 9 files, 1 and 3 honest workers never got a file
    in two runs. Turns by longest wait share the work the run has among all who
    want it; a node that asks seldom keeps its place for two heartbeats. Only nodes
    starved for steps: room kept for a node that asks up to a heartbeat later is idle
    meanwhile, and for every wait, however short, it cost the trainer a seventh of its
    steps' pace in a run where every step made a node wait (403 s against 357 s)."""
    since = now - 2.0 * svc.cfg.orchestrator.heartbeat_s
    others = [
        k
        for k, t in svc.wanting.copy().items()
        if t >= since and k != node and _holds(svc, k) >= policy - 1
    ]
    if not others or fresh >= groups * (len(others) + 1):
        return False
    marks = ", ".join("?" for _ in others)
    busy = {
        k
        for (k,) in cur.execute(
            f"SELECT DISTINCT node FROM assignments WHERE state = 'open' AND node IN ({marks})",
            others,
        ).fetchall()
    }
    others = [k for k in others if k not in busy]
    if not others:
        return False
    marks = ", ".join("?" for _ in others)
    recent = {
        k
        for (k,) in cur.execute(
            f"SELECT DISTINCT node FROM assignments WHERE step > ? AND node IN ({marks})",
            (step - STARVED_STEPS, *others),
        ).fetchall()
    }
    others = [k for k in others if k not in recent]
    if not others or fresh >= groups * (len(others) + 1):
        return False
    marks = ", ".join("?" for _ in others + [node])
    last = dict(
        cur.execute(
            f"SELECT key, registered FROM nodes WHERE key IN ({marks})", (*others, node)
        ).fetchall()
    )
    last |= dict(
        cur.execute(
            f"SELECT node, MAX(issued) FROM assignments WHERE node IN ({marks}) GROUP BY node",
            (*others, node),
        ).fetchall()
    )
    mine = last.get(node, now)
    longer = sum(1 for k in others if last.get(k, now) < mine)
    return fresh < groups * (longer + 1)


def _holds(svc: Service, node: str) -> int:
    v = svc.node_versions.get(node)
    return -1 if v is None else int(v)
