"""What every orchestrator operation needs: the run's config, the state database,
the object store and a clock (tests pass their own), and the run's identity.

The run identifier and the URL-signing secret are created on the first start
and kept in the database, so a restarted orchestrator (or a replica sharing
a PostgreSQL database) signs and checks the same way.
"""

from __future__ import annotations

import json
import secrets
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, MutableMapping
from dataclasses import dataclass, field

from swarmrl.config import RunConfig
from swarmrl.orchestrator.db import Database
from swarmrl.protocol import work_proof


def stored_object(text: str | None) -> dict:
    """A JSON object the database holds, or {} for anything else: what a writer stored
    is read as it is, and a reader never fails on a field it lacks."""
    try:
        value = json.loads(text) if text else {}
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


MAX_TRACKED = 100_000  # entries of each per-key table kept in memory (`Recent`)


class Recent(MutableMapping):
    """A dict that keeps its `size` most recently set entries: setting a key makes it
    the newest, and past `size` the oldest goes. Every per-key table the orchestrator
    keeps in memory is one, so that no number of keys can grow it without bound (the
    keys are registered nodes' only: a stranger's call is refused before any is set)."""

    def __init__(self, size: int = MAX_TRACKED):
        self.size = size
        self._items: OrderedDict = OrderedDict()
        self._lock = threading.Lock()

    def __setitem__(self, key, value) -> None:
        with self._lock:
            self._items[key] = value
            self._items.move_to_end(key)
            while len(self._items) > self.size:
                self._items.popitem(last=False)

    def __getitem__(self, key):
        return self._items[key]

    def __delitem__(self, key) -> None:
        with self._lock:
            del self._items[key]

    def pop(self, key, *default):
        with self._lock:
            return self._items.pop(key, *default)

    def __iter__(self):
        return iter(self.copy())

    def __len__(self) -> int:
        return len(self._items)

    def copy(self) -> dict:
        with self._lock:
            return dict(self._items)


class ApiError(Exception):
    """A refusal with its HTTP status and a message naming the problem."""

    def __init__(self, status: int, detail: str, retry_after_s: float | None = None):
        super().__init__(detail)
        self.status = status
        self.detail = detail
        self.retry_after_s = retry_after_s


@dataclass
class Service:
    cfg: RunConfig
    db: Database
    objects: object = None  # an ObjectStore (orchestrator/objects.py)
    trainer_keys: frozenset[str] = frozenset()
    validator_keys: frozenset[str] = frozenset()
    operator_token: str = ""
    clock: Callable[[], float] = time.time
    run_id: str = ""
    secret: bytes = b""
    upload_times: Recent = field(default_factory=Recent)  # work.py: key -> recent grants
    asked_work: Recent = field(default_factory=Recent)  # admission.py: key -> time
    # turns.yields_to_longer_waiting: key -> when it last asked for work the queue
    # had no room for (or left to a node waiting longer)
    wanting: Recent = field(default_factory=Recent)
    # the dashboard's view of the weights, as this replica saw it (not kept in the database):
    # each node's policy version at its last heartbeat, and when each version was announced
    node_versions: Recent = field(default_factory=Recent)
    published_at: Recent = field(default_factory=lambda: Recent(4096))
    # url -> (time asked, versions it serves or None, error): dashboard.py's ServerVersions
    server_versions: dict[str, tuple] = field(default_factory=dict)
    asking_servers: threading.Lock = field(default_factory=threading.Lock)
    # the proof of work a new key pays, set at start (admission.proof_bits); until then
    # the most there is, so that a service built without it admits no stranger cheaply
    work_bits: int = work_proof.MAX_BITS
    dataset_sha256: str | None = None
    taskset_pin: str = ""  # a verifiers taskset's fingerprint here, served as task.env_fingerprint

    def init_identity(self) -> None:
        self.run_id = self.meta("run_id") or self.set_meta_once("run_id", secrets.token_hex(8))
        hexsecret = self.meta("url_secret") or self.set_meta_once(
            "url_secret", secrets.token_hex(32)
        )
        self.secret = bytes.fromhex(hexsecret)
        with self.db.tx() as cur:
            cur.execute(
                "INSERT INTO counters VALUES ('assignment', 0) ON CONFLICT (name) DO NOTHING"
            )

    def meta(self, k: str, cur=None) -> str | None:
        if cur is None:
            with self.db.tx() as c:
                return self.meta(k, c)
        row = cur.execute("SELECT v FROM meta WHERE k = ?", (k,)).fetchone()
        return row[0] if row else None

    def set_meta(self, cur, k: str, v: str) -> None:
        cur.execute(
            "INSERT INTO meta VALUES (?, ?) ON CONFLICT (k) DO UPDATE SET v = excluded.v", (k, v)
        )

    def set_meta_once(self, k: str, v: str) -> str:
        """Set `k` unless another replica did first; the value that won."""
        with self.db.tx() as cur:
            cur.execute("INSERT INTO meta VALUES (?, ?) ON CONFLICT (k) DO NOTHING", (k, v))
            return cur.execute("SELECT v FROM meta WHERE k = ?", (k,)).fetchone()[0]

    def manifest_key(self) -> str:
        """The key a manifest of this run must be signed with, which `/v1/run` tells nodes
        to trust: `shardcast.public_key`, else the first trainer key."""
        return self.cfg.shardcast.public_key or min(self.trainer_keys, default="")

    def role_of(self, key: str) -> str:
        if key in self.trainer_keys:
            return "trainer"
        if key in self.validator_keys:
            return "validator"
        return "node"
