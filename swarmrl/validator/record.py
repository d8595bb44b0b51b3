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
one assignment, is a replay. A validator claims both before it judges (one
atomic insert under two uniqueness constraints), so validators working side
by side cannot both pass the same work.
"""

from __future__ import annotations

import json
import sqlite3
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from swarmrl.protocol.identity import sign, verify

PAYLOAD_PREFIX = b"swarmrl-verdict-v1\n"
PENDING = -1  # ledger state of a file being judged


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
    """One verdict name per store key (rollouts/a/b.parquet -> verdicts/a/b.parquet.json)."""
    return "verdicts/" + rollout_key.removeprefix("rollouts/") + ".json"


_TYPES = {"key": str, "sha256": str, "accepted": bool, "validator": str, "signature": str}


def read_verdict(data: bytes, trusted: list[str]) -> Verdict | None:
    """The verdict, if well formed and signed by one of the `trusted` keys; else None.
    Whatever the bytes (deep nesting, wrong types), this returns None, never raises."""
    try:
        v = Verdict(**json.loads(data))
        if any(not isinstance(getattr(v, k), t) for k, t in _TYPES.items()):
            return None
        if v.validator not in trusted or not verify(v.validator, v.payload(), v.signature):
            return None
        return v
    except Exception:  # any malformed verdict is simply not trusted
        return None


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
        self.db.execute(
            "CREATE UNIQUE INDEX IF NOT EXISTS one_file_per_assignment"
            " ON files (node, step, counter)"
        )

    def claim(self, sha256: str, key: str, node: str, step: int, counter: int) -> str | None:
        """Reserve these bytes and this assignment before judging; atomic, so two
        validators cannot both pass the same work. Returns None when the claim is
        ours, else the key of the earlier file (a replay). A claim left pending by
        a validator that died while judging this very file is taken over."""
        try:
            self.db.execute(
                "INSERT INTO files VALUES (?, ?, ?, ?, ?, ?, ?)",
                (sha256, key, node, step, counter, PENDING, time.time()),
            )
            return None
        except sqlite3.IntegrityError:
            row = self.db.execute(
                "SELECT key, sha256, accepted FROM files"
                " WHERE sha256 = ? OR (node = ? AND step = ? AND counter = ?)",
                (sha256, node, step, counter),
            ).fetchone()
            if row is None:  # removed meanwhile: try once more
                return self.claim(sha256, key, node, step, counter)
            if row[0] == key and row[1] == sha256 and row[2] == PENDING:
                return None
            return row[0]

    def release(self, sha256: str) -> None:
        """Drop a pending claim (the file could not be judged after all)."""
        self.db.execute("DELETE FROM files WHERE sha256 = ? AND accepted = ?", (sha256, PENDING))

    def settle(self, sha256: str, accepted: bool) -> None:
        self.db.execute("UPDATE files SET accepted = ? WHERE sha256 = ?", (int(accepted), sha256))

    def replay_of(self, sha256: str, node: str, step: int, counter: int) -> str | None:
        """The key of an earlier file with these bytes or this assignment, if any."""
        row = self.db.execute(
            "SELECT key FROM files WHERE sha256 = ? OR (node = ? AND step = ? AND counter = ?)",
            (sha256, node, step, counter),
        ).fetchone()
        return row[0] if row else None

    def record(self, v: Verdict, counter: int) -> None:
        """Claim and settle at once (a verdict reached without a claim)."""
        if self.claim(v.sha256, v.key, v.node, v.step, counter) is None:
            self.settle(v.sha256, v.accepted)

    def close(self) -> None:
        self.db.close()
