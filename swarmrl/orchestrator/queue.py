"""The pipelined rule's queue (orchestrator/work.py asks it for each request for
work): which step a file assigned now would be taken for, how much room the steps a
version is fresh for still have, and how many steps open while a node makes a file."""

from __future__ import annotations

from swarmrl.orchestrator import admission
from swarmrl.orchestrator.service import Service

WORTH_STEPS = 8  # the steps whose takings say what a step is worth (queued_for)


def queued_for(svc: Service, cur, run: dict, policy: int, node: str | None = None) -> int:
    """The step a file of `policy` assigned now would be taken for: the one being
    collected plus one for every step's worth of groups ahead of it (what that step has
    taken, and every group out: open assignments and files on their way, of proven
    nodes and of nodes on probation). A step's worth is the least of what the last
    `WORTH_STEPS` steps took (groups without signal included: a step takes more when
    fewer have signal), or trainer.batch_groups before any step was taken (with a
    smaller first batch, what the first step took scaled to the batch until a whole
    step was taken: at a 4% signal share a step takes about 100 groups, and an estimate
    of 4 let out one file at a time, so that the 9-worker SmolLM2 swarm waited minutes
    for its second step); the least,
    as a step that takes less than the estimate leaves the files queued behind it for
    the next, where a file of the oldest usable version is stale. Eight, not three: a
    step's take is noisy (16 to 22 groups at a 16-group batch), and after three steps
    of 18 one of 16 left two files stale. A step that took more
    than its worth and is still open (short of signal) is worth more than it took. With
    nothing out, a file of the newest version is for the step being collected: that
    step needs it, and no newer version comes before the trainer moves on. Otherwise a
    `node` whose measured pace says its file arrives only after more steps have opened
    is queued no earlier than the step open then (`steps_to_make`): at a step every
    few seconds, a file that takes a minute is for a step well past the queue's."""
    step, now, ahead, worth = _queue(svc, cur, run)
    if ahead == 0 and run["policy"] is not None and policy >= run["policy"]:
        return step
    at = step + (now + ahead) // worth
    return at if node is None else max(at, step + steps_to_make(svc, cur, node, step))


def _queue(svc: Service, cur, run: dict) -> tuple[int, int, int, int]:
    """The queue `queued_for` reads: the step being collected, the groups it took, the
    groups out (both pools), and a step's worth (see there)."""
    cfg = svc.cfg
    step = run["step"]
    oldest = step - cfg.async_level
    ahead = sum(admission.outstanding(svc, cur, oldest, probation) for probation in (False, True))
    taken = dict(
        cur.execute(
            "SELECT consumed_step, SUM(groups) FROM files WHERE consumed_step >= ?"
            " AND consumed_step <= ? GROUP BY consumed_step",
            (step - WORTH_STEPS, step),
        ).fetchall()
    )
    # a smaller first batch (trainer.first_batch_groups) is no step's worth; until a
    # whole step was taken, it says what one is worth scaled to the batch
    first_batch, batch = cfg.trainer.batch_for(1), cfg.trainer.batch_groups
    first = 2 if first_batch != batch else 1
    recent = [int(taken[k]) for k in range(max(step - WORTH_STEPS, first), step) if k in taken]
    now = int(taken.get(step, 0))
    if recent:
        per_step = min(recent)
    elif first == 2 and step > 1 and 1 in taken:
        per_step = -(-int(taken[1]) * batch // first_batch)
    else:
        per_step = batch
    return step, now, ahead, max(per_step, now + 1 if now > per_step else 1)


def fresh_room(svc: Service, cur, run: dict, policy: int) -> int:
    """Groups that may still be queued (`queued_for`) before a file of `policy` would be
    taken for a step where it is stale: the steps it is fresh for, at a step's worth
    each, less the groups the open step took and every group out (0 or less: none)."""
    step, now, ahead, worth = _queue(svc, cur, run)
    return (policy + svc.cfg.async_level - step + 1) * worth - (now + ahead)


def steps_to_make(svc: Service, cur, node: str, step: int) -> int:
    """Steps that open while `node` makes a file: its measured seconds for one (pace x
    groups x tokens, admission.measured_pace: assignment to submission) over the step
    period, the median of the last four steps' or the open step's age if longer (a
    stalled step lets slower nodes in). 0 without a pace or a step period yet."""
    pace = admission.measured_pace(cur, node)
    opened = [
        float(t)
        for (t,) in cur.execute(
            "SELECT opened FROM steps WHERE step >= ? AND step <= ? ORDER BY step", (step - 4, step)
        ).fetchall()
    ]
    gaps = sorted(b - a for a, b in zip(opened, opened[1:], strict=False))
    if pace is None or not gaps:
        return 0
    period = max(gaps[len(gaps) // 2], svc.clock() - opened[-1])
    cfg = svc.cfg
    seconds = pace * cfg.worker.groups_per_file * cfg.sampling.max_new_tokens
    return int(seconds // period) if period > 0 else 0
