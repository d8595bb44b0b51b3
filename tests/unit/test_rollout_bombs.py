"""Rollout files small on disk and huge decoded (bench/rollout_bombs.py), against every
reader: each is refused with a reason, and decoding never holds more memory than its
cap (the capped child's peak, and the reader's own resident memory). A bomb whose
sizes are declared is the sender's fault (RolloutFileError); one whose footer
understates them is found only by the cap, which proves nothing about the file
(RolloutUnreadable: no one is blamed; counted against the sender's standing)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench import rollout_bombs as bombs
from swarmrl import capped
from swarmrl.config import load_config
from swarmrl.protocol.assign import Assignment, rollout_key
from swarmrl.protocol.rollouts import (
    Limits,
    RolloutFileError,
    RolloutUnreadable,
    decode_memory,
    decoded_budget,
    read_rollouts,
    write_rollouts,
)
from swarmrl.trainer.batch import BatchCollector
from swarmrl.validator.checks import Context, Reject, check_without_model
from tests.unit.orch_util import Orch
from tests.unit.test_store_and_batch import MemoryQueue

ROOT = Path(__file__).resolve().parents[2]
# a run's files: 8 groups of 8, completions of at most 512 tokens
LIMITS = Limits(max_prompt_tokens=256, max_completion_tokens=512, max_rows=64, group_size=8)
MIB = 1 << 20

BOMBS = {
    # 64 rows x 1 MiB of text: 64 MiB decoded from a few kilobytes
    "dictionary": lambda: bombs.dictionary_bomb(rows=64, value_bytes=MIB),
    "repeated": lambda: bombs.repeated_bomb(rows=64, value_bytes=MIB),
    # 64 rows of 2^21 tokens, log-probs and mask entries: 1.1 GiB decoded
    "nested": lambda: bombs.nested_bomb(rows=64, elements=1 << 21),
}


@pytest.fixture(scope="module")
def files() -> dict[str, bytes]:
    made = {}
    for name, make in BOMBS.items():
        data = make()
        made[name] = data
        made[name + "/understated"] = bombs.understated(data)
    return made


@pytest.mark.parametrize("name", [f"{b}{f}" for b in BOMBS for f in ("", "/understated")])
def test_each_bomb_is_refused_within_the_cap(files, name):
    data = files[name]
    assert len(data) < 300_000  # small on disk
    budget = decoded_budget(LIMITS)
    with pytest.raises((RolloutFileError, RolloutUnreadable)) as e:
        read_rollouts(data, LIMITS)
    assert isinstance(e.value, RolloutUnreadable) == (name == "nested/understated")
    reason = str(e.value)
    column = "'completion'" if name.startswith(("dictionary", "repeated")) else "'completion_"
    how = ("decodes to", "uncompressed", "values, over", "needs more than")
    assert (column in reason or "memory" in reason) and any(h in reason for h in how), reason
    peak = capped.shared().last_peak_bytes
    assert peak <= decode_memory(budget), (name, peak)


def test_an_understated_footer_is_caught_after_decoding_not_before(files):
    """The footer of the understated nested bomb claims one value a column: nothing
    before decoding can see it; the child's cap refuses it."""
    import io

    import pyarrow.parquet as pq

    meta = pq.ParquetFile(io.BytesIO(files["nested/understated"])).metadata
    assert meta.row_group(0).column(3).num_values == 1
    with pytest.raises(RolloutUnreadable, match="memory"):
        read_rollouts(files["nested/understated"], LIMITS)


def test_honest_files_near_the_run_limits_read_and_stay_under_the_cap():
    rows = []
    for i in range(LIMITS.max_rows):
        r = bombs.honest_row(group=i // 8, tokens=LIMITS.max_completion_tokens)
        r["completion_tokens"] = [(i * 7919 + t) % 50000 for t in range(512)]
        r["completion"] = "abcd" * 512  # 4 bytes a token, more than real text
        r["proofs"] = bytes(8 * 512)
        rows.append(r)
    data = write_rollouts(rows)
    back = read_rollouts(data, LIMITS)
    assert len(back) == 64 and back[5]["completion_tokens"] == rows[5]["completion_tokens"]
    assert capped.shared().last_peak_bytes <= decode_memory(decoded_budget(LIMITS))


def test_the_reader_itself_never_decodes_a_bomb(tmp_path):
    """In a fresh process, reading every bomb leaves the reader's own peak resident
    memory within a few MiB of where it started: the bytes were decoded in the child."""
    script = tmp_path / "read.py"
    script.write_text(
        "import json, resource, sys\n"
        f"sys.path.insert(0, {str(ROOT)!r})\n"
        "from bench import rollout_bombs as b\n"
        "from swarmrl.protocol.rollouts import Limits, RolloutFileError, RolloutUnreadable\n"
        "from swarmrl.protocol.rollouts import read_rollouts, write_rollouts\n"
        "lim = Limits(max_prompt_tokens=256, max_completion_tokens=512, max_rows=64, group_size=8)\n"
        "files = [b.dictionary_bomb(64, 1 << 20), b.repeated_bomb(64, 1 << 20),\n"
        "         b.nested_bomb(64, 1 << 21)]\n"
        "files += [b.understated(f) for f in files]\n"
        "read_rollouts(write_rollouts([b.honest_row(0) for _ in range(8)]), lim)  # warm\n"
        "start = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
        "refused = 0\n"
        "for f in files:\n"
        "    try:\n"
        "        read_rollouts(f, lim)\n"
        "    except (RolloutFileError, RolloutUnreadable):\n"
        "        refused += 1\n"
        "end = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
        "print(json.dumps({'refused': refused, 'grew_kib': end - start}))\n"
    )
    out = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=240, cwd=ROOT
    )
    assert out.returncode == 0, out.stderr[-2000:]
    figures = json.loads(out.stdout.strip().splitlines()[-1])
    assert figures["refused"] == 6
    assert figures["grew_kib"] < 16 * 1024, figures  # the bombs decode to 64 MiB to 1.1 GiB


def _run_cfg(tmp_path):
    return load_config(
        None,
        [f"runs_dir={json.dumps(str(tmp_path / 'runs'))}", "name=t",
         "sampling.max_prompt_tokens=256", "sampling.max_new_tokens=512",
         "worker.group_size=8", "worker.groups_per_file=8"],
    )  # fmt: skip


def test_the_validator_refuses_each_bomb_at_the_schema_check_or_without_blame(files, tmp_path):
    cfg = _run_cfg(tmp_path)
    ctx = Context(cfg, None, None, None, 0.0, 0.0, 0.0, 0, 0, 0)
    assert decoded_budget(ctx.limits()) == decoded_budget(LIMITS)
    key = rollout_key(Assignment(5, 4, 1, 3), "ab" * 16, 8)
    for name, data in files.items():
        with pytest.raises(Reject) as e:
            check_without_model(ctx, key, data)
        want = "unverifiable" if name == "nested/understated" else "schema"
        assert e.value.check == want, (name, e.value)
        assert capped.shared().last_peak_bytes <= decode_memory(decoded_budget(LIMITS))


def test_the_trainer_refuses_each_bomb_and_goes_on(files):
    q = MemoryQueue()
    keys = {}
    for i, (name, data) in enumerate(sorted(files.items())):
        keys[name] = rollout_key(Assignment(5, 4, 0, i + 1), "ab" * 16, 2)
        q.put(keys[name], data)
    good = [bombs.honest_row(group=g) | {"reward": float(j)} for g in range(2) for j in range(8)]
    q.put(rollout_key(Assignment(5, 4, 0, 99), "ab" * 16, 2), write_rollouts(good))
    collector = BatchCollector(q, LIMITS, async_level=2, poll_s=0.01)
    batch = collector.collect(step=5, need_groups=2)
    # the understated bomb is skipped for now (it proves nothing), the others refused
    assert batch.groups == 2 and batch.rejected_files == len(files) - 1
    assert set(q.rejected) == set(keys.values()) - {keys["nested/understated"]}
    other = [r | {"reward": r["reward"] + 0.5} for r in good]  # other bytes (not a replay)
    q.put(rollout_key(Assignment(5, 4, 0, 7), "ab" * 16, 2), write_rollouts(other))
    batch = collector.collect(step=6, need_groups=2)  # tried again: refused, no one blamed
    assert batch.groups == 2 and len(q.rejected) == len(files)
    assert "unreadable twice" in q.rejected[keys["nested/understated"]]


def test_the_dashboard_viewer_refuses_each_bomb(files, tmp_path, monkeypatch):
    from swarmrl.orchestrator import dashboard

    decoded = []
    monkeypatch.setattr(
        dashboard, "read_rollouts", lambda *a: decoded.append(1) or read_rollouts(*a)
    )
    o = Orch(tmp_path, "orchestrator.public_rollouts=true", "sampling.max_prompt_tokens=256",
             "sampling.max_new_tokens=512", "worker.group_size=8", "worker.groups_per_file=8",
             "worker.max_pending_groups=1000",
             "orchestrator.assign=slack")  # many files out at once, none consumed  # fmt: skip
    w = o.worker("w")
    o.register(w)
    o.open_step(5, 4)
    for name, data in files.items():
        a = o.assignment(w, 4)["assignment"]
        g = o.upload(w, a["counter"], data)
        r = o.http.get("/v1/dashboard/files/" + g["key"])
        assert r.status_code == 200, (name, r.text)
        why = "could not be decoded" if name == "nested/understated" else "does not read as"
        assert why in r.json()["gone"] and r.json()["samples"] == []
        assert capped.shared().last_peak_bytes <= decode_memory(decoded_budget(LIMITS))
        again = o.http.get("/v1/dashboard/files/" + g["key"]).json()
        assert again["gone"] == r.json()["gone"]  # the refusal is remembered...
    assert len(decoded) == len(files)  # ...and no bomb was decoded twice


def _with_column(name: str, values: list) -> bytes:
    import io

    import pyarrow as pa
    import pyarrow.parquet as pq

    from swarmrl.protocol.rollouts import SCHEMA, VERSION, VERSION_KEY

    schema = SCHEMA.with_metadata({VERSION_KEY: str(VERSION).encode()})
    table = pa.Table.from_pylist([bombs.honest_row() for _ in range(8)], schema=schema)
    kind = schema.field(name).type
    if values and isinstance(values[0], bytes):
        column = pa.array(values, pa.binary()).view(kind)  # bytes that claim to be text
    else:
        column = pa.array(values, kind)
    table = table.set_column(table.schema.get_field_index(name), schema.field(name), column)
    buf = io.BytesIO()
    pq.write_table(table, buf)
    return buf.getvalue()


@pytest.mark.parametrize(
    ("name", "values", "reason"),
    [
        ("completion", [b"\xff\xfe"] * 8, "invalid column data"),
        ("completion_logprobs", [[-0.5, None]] * 8, "a list with a null"),
        ("completion_tokens", [[4, None]] * 8, "a list with a null"),
        ("prompt", [None] * 8, "holds a null"),
    ],
)
def test_invalid_text_and_nulls_are_refused_not_raised(name, values, reason):
    """Bytes that are not UTF-8 in a text column, or a null in a list, used to pass the
    checks and raise UnicodeDecodeError or TypeError in the reader."""
    data = _with_column(name, values)
    with pytest.raises(RolloutFileError, match=reason):
        read_rollouts(data, LIMITS)
