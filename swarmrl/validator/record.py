"""Verdicts and the validator's ledger.

A verdict is the record the orchestrator will keep for each submitted file:
which file (store key and sha256), whose (node key), for which step and policy
version, accept or reject, the check that failed with a reason and the failing
sample indices, the statistics of the checks, and the validator's key and
ed25519 signature over "swarmrl-verdict-v1\\n" + the canonical JSON of the
record with an empty signature. Until the orchestrator exists, verdicts are
objects in the rollout store (`verdicts/<key>.json`), and the trainer trusts
one only if a validator key it was given signed it and the sha256 matches the
file it reads.

The ledger (SQLite) remembers every file judged, by sha256 and by
(node, step, counter), so that a file submitted twice, or a second file for
one assignment, is a replay.
"""

from __future__ import annotations

import json
import sqlite3
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from swarmrl.protocol.identity import sign, verify

PAYLOAD_PREFIX = b"swarmrl-verdict-v1\n"


@dataclass
class Verdict:
    key: str
    sha256: str
    node: str
    step: int
    policy_step: int
    accepted: bool
    check: str = ""  # the check that failed ("" when accepted)
    reason: str = ""
    samples: list[int] = field(default_factory=list)
    n_samples: int = 0
    n_tokens: int = 0
    stats: dict = field(default_factory=dict)
    seconds: float = 0.0
    time: float = 0.0
    validator: str = ""
    signature: str = ""

    def payload(self) -> bytes:
        body = asdict(self) | {"signature": ""}
        return PAYLOAD_PREFIX + json.dumps(body, sort_keys=True, separators=(",", ":")).encode()

    def signed(self, key) -> Verdict:
        from swarmrl.protocol.identity import public_key_hex

        self.validator = public_key_hex(key)
        self.signature = ""
        self.signature = sign(key, self.payload())
        return self

    def to_json(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True).encode()


def verdict_key(rollout_key: str) -> str:
    return "verdicts/" + rollout_key.removeprefix("rollouts/").removesuffix(".parquet") + ".json"


def read_verdict(data: bytes, trusted: list[str]) -> Verdict | None:
    """The verdict, if well formed and signed by one of the `trusted` keys; else None."""
    try:
        v = Verdict(**json.loads(data))
    except (ValueError, TypeError):
        return None
    if v.validator not in trusted or not verify(v.validator, v.payload(), v.signature):
        return None
    return v


class Ledger:
    """Files already judged, shared by the validators of a run (one SQLite file)."""

    def __init__(self, path: Path):
        path.parent.mkdir(parents=True, exist_ok=True)
        self.db = sqlite3.connect(path, timeout=30.0, isolation_level=None)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute(
            "CREATE TABLE IF NOT EXISTS files (sha256 TEXT PRIMARY KEY, key TEXT NOT NULL,"
            " node TEXT NOT NULL, step INTEGER NOT NULL, counter INTEGER NOT NULL,"
            " accepted INTEGER NOT NULL, time REAL NOT NULL)"
        )
        self.db.execute("CREATE INDEX IF NOT EXISTS by_assignment ON files (node, step, counter)")

    def replay_of(self, sha256: str, node: str, step: int, counter: int) -> str | None:
        """The key of an earlier file with these bytes or this assignment, if any."""
        row = self.db.execute(
            "SELECT key FROM files WHERE sha256 = ? OR (node = ? AND step = ? AND counter = ?)",
            (sha256, node, step, counter),
        ).fetchone()
        return row[0] if row else None

    def record(self, v: Verdict, counter: int) -> None:
        self.db.execute(
            "INSERT OR IGNORE INTO files VALUES (?, ?, ?, ?, ?, ?, ?)",
            (v.sha256, v.key, v.node, v.step, counter, int(v.accepted), time.time()),
        )

    def close(self) -> None:
        self.db.close()
