"""Pipelined steps (orchestrator/queue.py, `queued_for`): a node gets work when its file
would still be fresh for the step it is queued for, so a node a version behind fills
the step being collected while the trainer updates, and waits once that step's work is
out; the trainer takes the oldest policy first."""

from __future__ import annotations

from swarmrl.protocol.identity import public_key_hex
from swarmrl.protocol.rollouts import write_rollouts
from tests.unit.test_dashboard_api import _rows

# no cap on the work out (worker.max_pending_groups): only the pipelining rule refuses;
# every file accepted at once (no validators)
FREE = ("async_level=2", "worker.max_pending_groups=100000", "validator.enabled=false")


def _workers(o, prefix: str, n: int) -> list:
    nodes = [o.worker(f"{prefix}{i}") for i in range(n)]
    for node in nodes:
        o.register(node)
    return nodes


def test_a_node_a_version_behind_fills_the_step_being_collected_then_waits(orch):
    o = orch(*FREE)
    batch, per_file = o.cfg.trainer.batch_groups, o.cfg.worker.groups_per_file
    o.open_step(3, 2)  # step 3 collected while 2 trains: the newest version is 2
    behind = _workers(o, "behind", batch // per_file + 1)
    # policy 1 is fresh for step 3 only (3 - 1 = async_level): a step's worth of its work
    for node in behind[:-1]:
        answer = o.assignment(node, 1)
        assert answer["wait"] is None and answer["assignment"]["policy_step"] == 1
    # step 3's groups are out: the next file would be taken for step 4, stale for policy 1
    assert o.assignment(behind[-1], 1)["wait"] == "late-for-its-step"
    # policy 2 is fresh for steps 3 and 4: a node holding it takes step 4's work, and
    # once that is out too, waits as well
    current = _workers(o, "current", batch // per_file + 1)
    for node in current[:-1]:
        assert o.assignment(node, 2)["assignment"]["policy_step"] == 2
    assert o.assignment(current[-1], 2)["wait"] == "late-for-its-step"


def test_the_rule_before_pipelining_keeps_a_node_a_version_behind_waiting(orch):
    o = orch(*FREE, "orchestrator.assign=slack")
    o.open_step(3, 2)
    (node,) = _workers(o, "behind", 1)
    assert o.assignment(node, 1)["wait"] == "stale-policy"  # with nothing out at all


def _submit(o, node, policy: int) -> str:
    a = o.assignment(node, policy)["assignment"]
    data = write_rollouts(_rows(public_key_hex(node), a["step"], policy))
    return o.upload(node, a["counter"], data)["key"]


def test_a_step_is_worth_what_the_last_steps_took(orch):
    """Groups without signal are dropped, so a step takes more than trainer.batch_groups:
    the estimate follows the least of the last steps' takings (queue.WORTH_STEPS)."""
    o = orch(*FREE)
    batch, per_file = o.cfg.trainer.batch_groups, o.cfg.worker.groups_per_file
    files_a_step = batch // per_file + 1  # a step that takes a file more than its batch
    nodes = _workers(o, "w", files_a_step)
    for step in (1, 2):
        o.open_step(step, step - 1)
        keys = [_submit(o, node, step - 1) for node in nodes]
        got = o.ok(o.trainer, "POST", "/v1/trainer/consume", {"step": step, "keys": keys})
        assert sorted(got["consumed"]) == sorted(keys)
    o.open_step(3, 2)
    for node in nodes:  # a version behind: as many files as a step took, not as a batch holds
        assert o.assignment(node, 1)["wait"] is None
    (late,) = _workers(o, "late", 1)
    assert o.assignment(late, 1)["wait"] == "late-for-its-step"


def test_a_smaller_first_batch_is_no_steps_worth(orch):
    """With trainer.first_batch_groups the first step takes one file: the estimate of a
    step's worth leaves it out, so a node a version behind still fills the step being
    collected (with it in, a step would be worth one file and the second node wait)."""
    o = orch(*FREE, "trainer.first_batch_groups=1")
    batch, per_file = o.cfg.trainer.batch_groups, o.cfg.worker.groups_per_file
    files_a_step = batch // per_file + 1
    nodes = _workers(o, "w", files_a_step)
    for step, senders in ((1, nodes[:1]), (2, nodes)):
        o.open_step(step, step - 1)
        keys = [_submit(o, node, step - 1) for node in senders]
        o.ok(o.trainer, "POST", "/v1/trainer/consume", {"step": step, "keys": keys})
    o.open_step(3, 2)
    for node in nodes:
        assert o.assignment(node, 1)["wait"] is None
    assert o.cfg.trainer.batch_for(1) == 1 and o.cfg.trainer.batch_for(2) == batch


def test_the_first_steps_take_scaled_to_the_batch_is_the_worth_until_a_step_is_taken(orch):
    """The first step trained on one group with signal and took 2 files for it: until a
    whole step is taken, a step is worth 2 files x the batch (groups with little signal
    are many), so the second step's work goes out to that many nodes at once; with the
    batch as the estimate only one file's worth would (the swarm waited minutes)."""
    o = orch(*FREE, "trainer.first_batch_groups=1")
    worth_files = 2 * o.cfg.trainer.batch_groups  # 2 files' groups x the batch / 1, in files
    nodes = _workers(o, "w", 2 * worth_files + 1)
    o.open_step(1, 0)
    keys = [_submit(o, node, 0) for node in nodes[:2]]
    o.ok(o.trainer, "POST", "/v1/trainer/consume", {"step": 1, "keys": keys})
    o.open_step(2, 1)
    # version 1 is fresh for steps 2 and 3: two steps' worth of files
    room = 2 * worth_files
    assert [o.assignment(n, 1)["wait"] for n in nodes[:room]] == [None] * room
    assert o.assignment(nodes[room], 1)["wait"] is not None  # the two steps are full


def test_the_trainer_takes_the_oldest_policy_first(orch):
    o = orch(*FREE)
    o.open_step(3, 2)
    # the newer file's key sorts first (its node's key is the lower): by key it would go first
    newer, older = sorted(_workers(o, "n", 2), key=public_key_hex)
    first = _submit(o, newer, 2)
    second = _submit(o, older, 1)
    listed = o.ok(o.trainer, "GET", "/v1/trainer/files", params={"step": 3})["files"]
    assert [f["key"] for f in listed] == [second, first]


def test_a_step_short_of_signal_still_gets_its_work(orch):
    """The first step, short of signal, takes three batches' worth and still needs
    more: nodes on version 0 (no newer one comes before step 1 is trained) keep getting
    its work, as long as nothing else is out."""
    o = orch(*FREE)
    batch, per_file = o.cfg.trainer.batch_groups, o.cfg.worker.groups_per_file
    o.open_step(1, 0)
    nodes = _workers(o, "w", 3 * batch // per_file)
    for node in nodes:  # each file taken as it comes
        key = _submit(o, node, 0)
        assert o.ok(o.trainer, "POST", "/v1/trainer/consume", {"step": 1, "keys": [key]})[
            "consumed"
        ] == [key]
    for node in nodes[:2]:
        assert o.assignment(node, 0)["wait"] is None


def test_no_work_goes_out_for_a_step_past_the_runs_last(orch):
    o = orch(*FREE, "trainer.steps=3")
    batch, per_file = o.cfg.trainer.batch_groups, o.cfg.worker.groups_per_file
    o.open_step(3, 2)  # the last step
    nodes = _workers(o, "w", batch // per_file + 1)
    for node in nodes[:-1]:
        assert o.assignment(node, 2)["wait"] is None
    assert o.assignment(nodes[-1], 2)["wait"] == "enough-work"  # step 3's work is out


def test_a_node_whose_file_arrives_steps_later_is_queued_for_that_step(orch):
    """Steps open every 5 s; a node whose pace (here, its claimed speed) makes a file in
    60 s would deliver it 12 steps on, where a file of the newest policy is stale: it
    waits, while a node that makes one in a second gets the work."""
    from tests.unit.orch_util import HW

    o = orch(*FREE)
    cfg = o.cfg
    for step in (1, 2, 3, 4):
        o.open_step(step, step - 1)
        o.clock.t += 5.0
    tokens = cfg.worker.group_size * cfg.worker.groups_per_file * cfg.sampling.max_new_tokens
    fast, slow = o.worker("fast"), o.worker("slow")
    o.register(fast, HW | {"tokens_per_s": tokens / 1.0})
    o.register(slow, HW | {"tokens_per_s": tokens / 60.0})
    assert o.assignment(fast, 3)["wait"] is None
    assert o.assignment(slow, 3)["wait"] == "late-for-its-step"
    # a stalled step lets it in: after a minute without a new step, its file is for
    # the step after next at most
    o.clock.t += 60.0
    assert o.assignment(slow, 3)["wait"] is None


def test_a_node_on_probation_gets_work_only_where_its_file_would_be_fresh(orch, tmp_path):
    """A new node's files are for its verdict, but one that arrives stale is work
    thrown away: a node on probation is queued as any other. Holding an older version
    once the newer one's work is out, it waits for the newer; holding the newest, it
    gets work while the steps its version is fresh for have room, then waits too."""
    import json

    from swarmrl.protocol.identity import load_or_create_key

    proven = [load_or_create_key(tmp_path / "nodes" / f"p{i}" / "node.key") for i in range(16)]
    trusted = json.dumps([public_key_hex(k) for k in proven])
    o = orch(*FREE, "orchestrator.probation_files=2", f"orchestrator.trusted_workers={trusted}")
    batch, per_file = o.cfg.trainer.batch_groups, o.cfg.worker.groups_per_file
    o.open_step(3, 2)
    for node in proven[: batch // per_file]:  # step 3's work out, to trusted nodes
        o.register(node)
        assert o.assignment(node, 1)["wait"] is None
    old, newest = _workers(o, "n", 2)
    assert o.assignment(old, 1)["wait"] == "late-for-its-step"
    assert o.assignment(newest, 2)["wait"] is None
    for node in proven[batch // per_file : 2 * batch // per_file - 1]:  # step 4's, to trusted
        o.register(node)
        assert o.assignment(node, 2)["wait"] is None
    (late,) = _workers(o, "late", 1)
    assert o.assignment(late, 2)["wait"] == "late-for-its-step"  # its file would be for step 5


def test_a_step_is_worth_the_least_of_the_last_eight_takings(orch):
    """A step that took its batch, then three that took a file more: the next may take
    its batch again, so the estimate stays at the batch and nodes a version behind get
    a batch's worth of work, not a file more (with the last three, the file more went
    stale whenever the next step took its batch)."""
    o = orch(*FREE)
    batch, per_file = o.cfg.trainer.batch_groups, o.cfg.worker.groups_per_file
    nodes = _workers(o, "w", batch // per_file + 1)
    for step, senders in ((1, nodes[:-1]), (2, nodes), (3, nodes), (4, nodes)):
        o.open_step(step, step - 1)
        keys = [_submit(o, node, step - 1) for node in senders]
        o.ok(o.trainer, "POST", "/v1/trainer/consume", {"step": step, "keys": keys})
    o.open_step(5, 4)
    for node in nodes[:-1]:
        assert o.assignment(node, 3)["wait"] is None
    assert o.assignment(nodes[-1], 3)["wait"] == "late-for-its-step"


def test_the_queues_room_goes_to_the_node_that_waited_longest(orch):
    """Room in the queue goes to whoever asks first once a version is out, and a node
    turned away asks less and less often: with 32 workers, 1 and 3 honest workers
    never got a file. A node that just had one leaves the last file's room to a node
    turned away that has waited longer, which then gets it."""
    o = orch(*FREE)
    batch, per_file = o.cfg.trainer.batch_groups, o.cfg.worker.groups_per_file
    served = _workers(o, "s", 2 * batch // per_file)
    (waiting,) = _workers(o, "waiting", 1)  # registered with them, never served
    o.clock.t += 1.0
    o.open_step(3, 2)
    keys = [_submit(o, node, 2) for node in served[: batch // per_file]]  # step 3's
    for node in served[batch // per_file :]:  # and step 4's: the queue is full
        assert o.assignment(node, 2)["wait"] is None
    assert o.assignment(waiting, 2)["wait"] == "late-for-its-step"
    o.ok(o.trainer, "POST", "/v1/trainer/consume", {"step": 3, "keys": keys})
    o.clock.t += 30.0  # a step every 30 s: every node's file is for the step it is queued for
    o.open_step(4, 3)  # step 4's work is out: a step's worth of room for version 3
    # the waiting node has not fetched version 3 yet: turned away again
    assert o.assignment(waiting, 2)["wait"] == "late-for-its-step"
    first, *others = served[: batch // per_file]
    for node in others:  # all but the last file's room, taken by nodes that had a file
        assert o.assignment(node, 3)["wait"] is None
    assert o.assignment(first, 3)["wait"] == "longer-waiting-first"
    got = o.assignment(waiting, 3)  # a moment later, holding the new version too
    assert got["wait"] is None and got["assignment"]["policy_step"] == 3


def test_room_is_kept_only_for_a_node_starved_for_steps(orch):
    """A node turned away that had a file in the last STARVED_STEPS steps keeps no
    room, though it waited longer: keeping it idles the queue until that node asks
    again, a cost only a starved node is worth."""
    o = orch(*FREE)
    batch, per_file = o.cfg.trainer.batch_groups, o.cfg.worker.groups_per_file
    served = _workers(o, "s", 2 * batch // per_file)
    (extra,) = _workers(o, "x", 1)
    o.clock.t += 1.0
    o.open_step(3, 2)
    recent, first, *rest = served[: batch // per_file]
    keys = [_submit(o, recent, 2)]  # the earliest assignment of all: it waited longest
    o.clock.t += 0.5
    keys += [_submit(o, node, 2) for node in [first, *rest]]
    for node in served[batch // per_file :]:
        assert o.assignment(node, 2)["wait"] is None
    o.ok(o.trainer, "POST", "/v1/trainer/consume", {"step": 3, "keys": keys})
    o.clock.t += 30.0
    o.open_step(4, 3)
    assert o.assignment(recent, 2)["wait"] == "late-for-its-step"  # had a file at step 3
    for node in [extra, *rest]:  # all but the last file's room
        assert o.assignment(node, 3)["wait"] is None
    assert o.assignment(first, 3)["wait"] is None
