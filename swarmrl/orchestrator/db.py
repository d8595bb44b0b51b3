"""The orchestrator's state database: one small interface, two engines.

`Database.tx()` opens a transaction and yields a cursor whose `execute(sql,
params)` takes `?` placeholders; everything the orchestrator keeps (nodes,
nonces, assignments, files, the ledger of stakes and slashes) is written
through it, in SQL that SQLite and PostgreSQL both accept. `open_database`
picks the engine from `orchestrator.database`, here and nowhere else:

- SQLite (the default, a file in the run directory): WAL journal, every
  write transaction `BEGIN IMMEDIATE`, so two processes on one file
  serialise instead of failing. `synchronous=NORMAL`: a commit is durable
  once written to the WAL, so a killed or restarted orchestrator loses
  nothing; a power loss or OS crash may lose the last commits (never the
  database's consistency). FULL (an fsync per commit) measured 4 to 12 ms per
  commit on this machine's disk, two commits per signed request (the nonce,
  then the operation), which alone capped the API far below its goal. The WAL
  is copied back into the database (a checkpoint, with its fsyncs) by the
  orchestrator's sweeper thread, on a connection of its own (`checkpoint`),
  not by the commit that happens to fill it: in the emulated swarm of 35 nodes
  that commit, inside a request, made the requests' p99;
- PostgreSQL (`postgresql://...`, psycopg 3): for operators who run several
  orchestrator replicas behind one address. Every multi-row decision is one
  conditional UPDATE (`... WHERE state = 'x' RETURNING`), so replicas (and
  the pooled connections of one replica) racing for the same row cannot both
  win. The capacity check before a new assignment is a read, so concurrent
  heartbeats may each see room for one more file: assignments can overshoot
  the limit by the number of requests in flight, never grow without bound.

SQLite runs one transaction at a time in a process (a lock around its one
connection). PostgreSQL runs up to 8 at once, one per pooled connection: with
one connection, every request queued behind the round trips and the commit
fsync of the one before it (p99 0.36 to 7 s at 1000 simulated nodes; with
the pool 19 to 33 ms, bench/orchestrator_load.py). An earlier try of the pool
measured no better because the orchestrator's own CPU was then the limit.
"""

from __future__ import annotations

import hashlib
import sqlite3
import threading
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path

SCHEMA = [
    "CREATE TABLE IF NOT EXISTS meta (k TEXT PRIMARY KEY, v TEXT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS counters (name TEXT PRIMARY KEY, value BIGINT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS nonces (key TEXT NOT NULL, nonce TEXT NOT NULL,"
    " time DOUBLE PRECISION NOT NULL, PRIMARY KEY (key, nonce))",
    "CREATE INDEX IF NOT EXISTS nonces_time ON nonces (time)",
    "CREATE TABLE IF NOT EXISTS nodes (key TEXT PRIMARY KEY, role TEXT NOT NULL,"
    " state TEXT NOT NULL, registered DOUBLE PRECISION NOT NULL,"
    " last_seen DOUBLE PRECISION NOT NULL, hardware TEXT NOT NULL, budget BIGINT NOT NULL,"
    " url TEXT NOT NULL, stake DOUBLE PRECISION NOT NULL, slashed DOUBLE PRECISION NOT NULL,"
    " reason TEXT NOT NULL, net TEXT NOT NULL DEFAULT '', endpoints TEXT NOT NULL DEFAULT '')",
    "CREATE INDEX IF NOT EXISTS nodes_net ON nodes (net, role, state)",
    "CREATE TABLE IF NOT EXISTS assignments (counter BIGINT PRIMARY KEY, node TEXT NOT NULL,"
    " step BIGINT NOT NULL, policy BIGINT NOT NULL, seed BIGINT NOT NULL,"
    " groups BIGINT NOT NULL, max_new_tokens BIGINT NOT NULL,"
    " issued DOUBLE PRECISION NOT NULL, deadline DOUBLE PRECISION NOT NULL,"
    " state TEXT NOT NULL, reissue_of BIGINT)",
    "CREATE INDEX IF NOT EXISTS assignments_state ON assignments (state, step)",
    "CREATE INDEX IF NOT EXISTS assignments_node ON assignments (node, state)",
    "CREATE TABLE IF NOT EXISTS files (key TEXT PRIMARY KEY, sha256 TEXT NOT NULL UNIQUE,"
    " node TEXT NOT NULL, step BIGINT NOT NULL, policy BIGINT NOT NULL,"
    " counter BIGINT NOT NULL UNIQUE, groups BIGINT NOT NULL, size BIGINT NOT NULL,"
    " state TEXT NOT NULL, checked INTEGER NOT NULL, created DOUBLE PRECISION NOT NULL,"
    " submitted DOUBLE PRECISION, validator TEXT, lease DOUBLE PRECISION, verdict TEXT,"
    " check_name TEXT, reason TEXT, consumed_step BIGINT, final INTEGER NOT NULL,"
    " void INTEGER NOT NULL)",
    "CREATE INDEX IF NOT EXISTS files_state ON files (state, policy)",
    "CREATE INDEX IF NOT EXISTS files_node ON files (node)",
    "CREATE INDEX IF NOT EXISTS files_step ON files (step, counter)",  # the dashboard's reads
    "CREATE INDEX IF NOT EXISTS files_submitted ON files (submitted)",
    # what the last steps took, read by every ask for work (queue.queued_for)
    "CREATE INDEX IF NOT EXISTS files_consumed ON files (consumed_step)",
    "CREATE TABLE IF NOT EXISTS steps (step BIGINT PRIMARY KEY, sampler TEXT NOT NULL,"
    " opened DOUBLE PRECISION NOT NULL)",
    # reports name the relay's key (relaystanding.py); holds: delisted keys and addresses
    "CREATE TABLE IF NOT EXISTS relay_reports (relay TEXT NOT NULL, reporter TEXT NOT NULL,"
    " time DOUBLE PRECISION NOT NULL, what TEXT NOT NULL, PRIMARY KEY (relay, reporter))",
    "CREATE INDEX IF NOT EXISTS relay_reports_reporter ON relay_reports (reporter, time)",
    "CREATE TABLE IF NOT EXISTS relay_holds (kind TEXT NOT NULL, name TEXT NOT NULL,"
    " until DOUBLE PRECISION NOT NULL, times BIGINT NOT NULL, PRIMARY KEY (kind, name))",
    # the faucet of each address range (admission.py), beside the run's in `meta`
    "CREATE TABLE IF NOT EXISTS faucets (net TEXT PRIMARY KEY, level DOUBLE PRECISION NOT NULL,"
    " time DOUBLE PRECISION NOT NULL)",
    "CREATE TABLE IF NOT EXISTS relay_checks (url TEXT PRIMARY KEY, listed INTEGER NOT NULL,"
    " failures BIGINT NOT NULL, version BIGINT, checked DOUBLE PRECISION NOT NULL,"
    " next_check DOUBLE PRECISION NOT NULL, detail TEXT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS mismatch (step BIGINT NOT NULL, node TEXT NOT NULL,"
    " checked INTEGER NOT NULL, staleness BIGINT NOT NULL, tokens BIGINT NOT NULL,"
    " kl DOUBLE PRECISION NOT NULL, truncated DOUBLE PRECISION NOT NULL, files BIGINT NOT NULL,"
    " PRIMARY KEY (step, node, checked, staleness))",
    "CREATE TABLE IF NOT EXISTS standing (node TEXT PRIMARY KEY, proven BIGINT NOT NULL,"
    " expired BIGINT NOT NULL, last_expired DOUBLE PRECISION NOT NULL,"
    " judged BIGINT NOT NULL DEFAULT 0, blameless BIGINT NOT NULL DEFAULT 0)",
    "CREATE TABLE IF NOT EXISTS invites (hash TEXT PRIMARY KEY, stake DOUBLE PRECISION NOT NULL,"
    " issued DOUBLE PRECISION NOT NULL, used_by TEXT, used DOUBLE PRECISION)",
    "CREATE TABLE IF NOT EXISTS pace (node TEXT PRIMARY KEY, s_per_unit DOUBLE PRECISION NOT NULL,"
    " files BIGINT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS suspects (node TEXT PRIMARY KEY, time DOUBLE PRECISION NOT NULL,"
    " step BIGINT NOT NULL, detail TEXT NOT NULL)",
    # the trainer's metrics rows and the launcher's held-out scores, for the dashboard
    "CREATE TABLE IF NOT EXISTS run_metrics (step BIGINT PRIMARY KEY,"
    " time DOUBLE PRECISION NOT NULL, row TEXT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS evaluations (name TEXT PRIMARY KEY, step BIGINT NOT NULL,"
    " time DOUBLE PRECISION NOT NULL, result TEXT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS events (id {autoid}, time DOUBLE PRECISION NOT NULL,"
    " node TEXT NOT NULL, kind TEXT NOT NULL, amount DOUBLE PRECISION NOT NULL,"
    " detail TEXT NOT NULL)",
]

# columns added since a table was first made: added to a database from before
ADDED_COLUMNS = [
    ("nodes", "net", "TEXT NOT NULL DEFAULT ''"),
    ("nodes", "endpoints", "TEXT NOT NULL DEFAULT ''"),
    ("standing", "judged", "BIGINT NOT NULL DEFAULT 0"),
    ("standing", "blameless", "BIGINT NOT NULL DEFAULT 0"),
]


class Cursor:
    """`execute` with `?` placeholders on either engine; rows are tuples."""

    def __init__(self, raw, paramstyle: str):
        self.raw = raw
        self.paramstyle = paramstyle

    def execute(self, sql: str, params: tuple | list = ()) -> Cursor:
        if self.paramstyle == "format":
            sql = sql.replace("?", "%s")
        self.raw.execute(sql, tuple(params))
        return self

    def fetchone(self):
        return self.raw.fetchone()

    def fetchall(self) -> list:
        return self.raw.fetchall()

    @property
    def rowcount(self) -> int:
        return self.raw.rowcount


class Database:
    """The interface: `tx()` (a transaction), `one()` (a single statement that is its
    own transaction: one round trip, for the hottest write) and `close()`."""

    engine = "?"

    def tx(self) -> Iterator[Cursor]:  # pragma: no cover - interface
        raise NotImplementedError

    def one(self, sql: str, params: tuple = ()) -> list:  # pragma: no cover - interface
        raise NotImplementedError

    def close(self) -> None:  # pragma: no cover - interface
        raise NotImplementedError

    def read(self) -> AbstractContextManager[Cursor]:
        """A transaction that only reads (the ledger, the dashboard, /metrics): here
        `tx()`; SQLite reads a snapshot beside the writer instead."""
        return self.tx()

    def checkpoint(self) -> None:
        """Move what the journal holds into the database, off the request path (only
        SQLite has work to do here)."""

    def serialize(self, cur: Cursor, name: str) -> None:
        """Hold the lock `name` until `cur`'s transaction ends, so that transactions
        that read a count and act on it (a faucet, a share of a pool) take turns. No-op
        on SQLite, whose transactions take turns already (one writer, BEGIN IMMEDIATE)."""

    def _columns(self, cur: Cursor, table: str) -> set[str]:  # pragma: no cover - interface
        raise NotImplementedError

    def create_schema(self) -> None:
        autoid = "INTEGER PRIMARY KEY" if self.engine == "sqlite" else "BIGSERIAL PRIMARY KEY"
        with self.tx() as cur:
            # the mismatch table gained `staleness`: a table from before holds only a
            # window of the trainer's figures, rebuilt by the next steps it reports
            columns = self._columns(cur, "mismatch")
            if columns and "staleness" not in columns:
                cur.execute("DROP TABLE mismatch")
            # relay reports once named a URL: they are short-lived, and start afresh
            columns = self._columns(cur, "relay_reports")
            if columns and "relay" not in columns:
                cur.execute("DROP TABLE relay_reports")
            for table, column, kind in ADDED_COLUMNS:
                columns = self._columns(cur, table)
                if columns and column not in columns:
                    cur.execute(f"ALTER TABLE {table} ADD COLUMN {column} {kind}")
            for stmt in SCHEMA:
                cur.execute(stmt.replace("{autoid}", autoid))


WAL_PAGES = 8000


class SQLiteDatabase(Database):
    engine = "sqlite"

    def _columns(self, cur: Cursor, table: str) -> set[str]:
        return {r[1] for r in cur.execute(f"PRAGMA table_info({table})").fetchall()}

    def __init__(self, path: Path):
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        self.conn = sqlite3.connect(
            path, timeout=30.0, isolation_level=None, check_same_thread=False
        )
        self.conn.execute("PRAGMA journal_mode=WAL")
        self.conn.execute("PRAGMA synchronous=NORMAL")
        # commits leave checkpoints to `checkpoint` (the sweeper's, every second) unless
        # the WAL grows past 8,000 pages (32 MiB) without one: a safety net, not the rule
        self.conn.execute(f"PRAGMA wal_autocheckpoint={WAL_PAGES}")
        self.path = path
        self.lock = threading.Lock()
        self.local = threading.local()  # each thread's reading connection (`read`)
        self.readers: list[sqlite3.Connection] = []
        self.readers_lock = threading.Lock()  # not `lock`: a reader never waits for a write
        self.create_schema()

    def checkpoint(self) -> None:
        """A PASSIVE checkpoint on a connection of its own: it copies what no reader
        still needs and never waits for the request path's lock or blocks a writer."""
        conn = sqlite3.connect(self.path, timeout=1.0, isolation_level=None)
        try:
            conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
        finally:
            conn.close()

    @contextmanager
    def tx(self) -> Iterator[Cursor]:
        with self.lock:
            cur = self.conn.cursor()
            cur.execute("BEGIN IMMEDIATE")
            try:
                yield Cursor(cur, "qmark")
            except BaseException:
                cur.execute("ROLLBACK")
                raise
            cur.execute("COMMIT")

    def one(self, sql: str, params: tuple = ()) -> list:
        with self.lock:  # autocommit: the statement is its own transaction
            return self.conn.execute(sql, params).fetchall()

    @contextmanager
    def read(self) -> Iterator[Cursor]:
        """A snapshot on the calling thread's own connection (WAL: readers and the
        writer do not wait for each other), so a long read does not hold the lock
        every write waits for. In the emulated swarm the ledger, read by the
        launcher's progress line, held it for up to 170 ms while starved of CPU."""
        conn = getattr(self.local, "conn", None)
        if conn is None:
            conn = sqlite3.connect(
                self.path, timeout=30.0, isolation_level=None, check_same_thread=False
            )
            conn.execute("PRAGMA query_only=ON")
            self.local.conn = conn
            with self.readers_lock:
                self.readers.append(conn)
        cur = conn.cursor()
        cur.execute("BEGIN")
        try:
            yield Cursor(cur, "qmark")
        finally:
            cur.execute("COMMIT")

    def close(self) -> None:
        with self.readers_lock:
            for conn in self.readers:
                conn.close()
            self.readers.clear()
        self.conn.close()


class PostgresDatabase(Database):
    """A pool of up to `connections`, opened as concurrent requests need them: the
    transactions of concurrent requests run side by side in PostgreSQL, so their
    round trips and commits overlap."""

    engine = "postgres"

    def _columns(self, cur: Cursor, table: str) -> set[str]:
        rows = cur.execute(
            "SELECT column_name FROM information_schema.columns"
            " WHERE table_schema = current_schema() AND table_name = ?",
            (table,),
        ).fetchall()
        return {r[0] for r in rows}

    def __init__(self, url: str, connections: int = 8):
        import queue

        import psycopg

        self._connect = lambda: psycopg.connect(url, autocommit=True)  # explicit transactions
        self.idle: queue.LifoQueue = queue.LifoQueue()
        self.conns = [self._connect()]  # more are opened as concurrent requests need them
        self.idle.put(self.conns[0])
        self.max_connections = connections
        self.opening = threading.Lock()
        self.create_schema()

    @contextmanager
    def _conn(self):
        import queue

        conn = None
        while conn is None:
            try:
                conn = self.idle.get(timeout=0.0 if len(self.conns) < self.max_connections else 1.0)
            except queue.Empty:  # none idle: open one if below the cap (dead ones were removed)
                with self.opening:
                    if len(self.conns) < self.max_connections:
                        conn = self._connect()
                        self.conns.append(conn)
        try:
            yield conn
        finally:
            if conn.broken or conn.closed:  # the server went away: open a fresh one next time
                with self.opening:
                    self.conns.remove(conn)
            else:
                self.idle.put(conn)

    def checkpoint(self) -> None:
        """Move what the journal holds into the database, off the request path (only
        SQLite has work to do here)."""

    def serialize(self, cur: Cursor, name: str) -> None:
        # READ COMMITTED lets two transactions read the same count; an advisory lock
        # scoped to the transaction makes the second wait for the first's commit
        number = int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "big", signed=True)
        cur.execute("SELECT pg_advisory_xact_lock(?)", (number,))

    @contextmanager
    def tx(self) -> Iterator[Cursor]:
        with self._conn() as conn, conn.transaction(), conn.cursor() as cur:
            yield Cursor(cur, "format")

    def one(self, sql: str, params: tuple = ()) -> list:
        with self._conn() as conn:  # autocommit: the statement is its own transaction
            return conn.execute(sql.replace("?", "%s"), params).fetchall()

    def close(self) -> None:
        for c in self.conns:
            c.close()


def open_database(spec: str, default_path: Path) -> Database:
    """`spec`: '' (SQLite at `default_path`), a SQLite file path, or a postgresql:// URL."""
    if spec.startswith(("postgresql://", "postgres://")):
        return PostgresDatabase(spec)
    return SQLiteDatabase(Path(spec) if spec else default_path)
