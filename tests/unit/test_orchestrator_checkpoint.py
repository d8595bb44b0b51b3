"""The SQLite ledger's journal is copied back by the sweeper (`Database.checkpoint`),
not by whichever request's commit fills it: that commit's fsyncs made the emulated
swarm's p99 (db.py)."""

from __future__ import annotations

import sqlite3

from swarmrl.orchestrator.db import WAL_PAGES, SQLiteDatabase


def test_commits_leave_the_checkpoint_to_the_sweeper(tmp_path):
    path = tmp_path / "state.sqlite"
    db = SQLiteDatabase(path)
    wal = tmp_path / "state.sqlite-wal"
    page = db.one("PRAGMA page_size")[0][0]
    start = path.stat().st_size
    for i in range(1500):  # each commit writes pages: past SQLite's default of 1,000
        with db.tx() as cur:
            cur.execute("INSERT INTO nonces VALUES (?, ?, ?)", (f"k{i}", "n" * 64, float(i)))
    assert 1000 * page < wal.stat().st_size < WAL_PAGES * page * 2  # no commit checkpointed
    assert path.stat().st_size == start  # everything is still in the journal
    db.checkpoint()
    assert path.stat().st_size > start  # copied back
    check = sqlite3.connect(path)
    assert check.execute("SELECT COUNT(*) FROM nonces").fetchone()[0] == 1500
    busy, frames, done = check.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
    assert busy == 0 and frames == done  # nothing was left for this one
    check.close()
    with db.tx() as cur:  # the next writer starts the journal over
        cur.execute("INSERT INTO nonces VALUES ('x', 'y', 0)")
    assert db.one("SELECT COUNT(*) FROM nonces")[0][0] == 1501
    db.close()


def test_reads_take_a_snapshot_beside_a_write_in_progress(tmp_path):
    """The ledger, the dashboard and /metrics read on a connection of their own
    (`Database.read`): while a write transaction holds the lock every write waits
    for, they answer at once with what was committed before it."""
    import threading

    from tests.unit.orch_util import Orch, pubhex

    o = Orch(tmp_path)
    w = o.worker("w")
    o.register(w)
    answers: dict[str, object] = {}

    def read_all() -> None:
        answers["ledger"] = o.http.get("/v1/ledger").json()
        answers["metrics"] = o.http.get("/metrics").status_code
        answers["swarm"] = o.http.get("/v1/dashboard/swarm").status_code

    with o.svc.db.tx() as cur:  # a write in progress, holding the lock
        cur.execute("UPDATE nodes SET stake = 7 WHERE key = ?", (pubhex(w),))
        reader = threading.Thread(target=read_all, daemon=True)
        reader.start()
        reader.join(10)
        assert not reader.is_alive(), "a read waited for the write in progress"
    stakes = {n["key"]: n["stake"] for n in answers["ledger"]["nodes"]}
    assert stakes[pubhex(w)] == o.cfg.orchestrator.stake  # the snapshot before the write
    assert answers["metrics"] == answers["swarm"] == 200
    assert o.ledger()[pubhex(w)]["stake"] == 7  # and the write's, once committed
