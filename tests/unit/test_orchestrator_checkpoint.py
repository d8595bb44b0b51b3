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
