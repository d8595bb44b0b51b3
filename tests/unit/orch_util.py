"""An in-process orchestrator for unit tests: the real app, database and object
store, driven through FastAPI's TestClient (no network), with a clock the test
moves and keys for a trainer, a validator, workers and the operator."""

from __future__ import annotations

import copy
import json
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from swarmrl.config import load_config
from swarmrl.launch.supervisor import free_port
from swarmrl.orchestrator.app import build_app
from swarmrl.orchestrator.server import make_service
from swarmrl.protocol.identity import load_or_create_key, public_key_hex
from swarmrl.protocol.signing import sign_request

HW = {"cpus": 2, "memory_gb": 8.0, "tokens_per_s": 500.0}


class Clock:
    def __init__(self, t: float | None = None):
        self.t = time.time() if t is None else t

    def __call__(self) -> float:
        return self.t


class Orch:
    def __init__(self, tmp: Path, *overrides: str, database: str = ""):
        self.tmp = tmp
        keys = tmp / "runs" / "t" / "keys"
        self.trainer = load_or_create_key(keys / "trainer.key")
        self.validator = load_or_create_key(keys / "validator-0.key")
        # no probation, proof of work, faucet limit or share per address range unless a
        # test asks for them (test_orchestrator_admission.py, test_orchestrator_entry.py,
        # test_orchestrator_ranges.py do): every call comes from one test client
        over = [
            f"runs_dir={json.dumps(str(tmp / 'runs'))}",
            "name=t",
            "orchestrator.probation_files=0",
            "orchestrator.register_work_bits=0",
            "orchestrator.faucet_burst=1000000",
            "orchestrator.range_share=1",
        ]
        if database:
            over.append(f"orchestrator.database={json.dumps(database)}")
        self.cfg = load_config(None, over + list(overrides))
        self.clock = Clock()
        self.open()

    def open(self) -> None:
        self.svc = make_service(self.cfg, "http://testserver")
        self.svc.clock = self.clock
        self.http = TestClient(build_app(self.svc))
        self.token = self.svc.operator_token

    def restart(self) -> None:
        self.svc.db.close()
        self.open()

    def at(self, host: str) -> Orch:
        """This orchestrator as called from the peer address `host` (the same app)."""
        other = copy.copy(self)
        other.http = TestClient(self.http.app, client=(host, 50000))
        return other

    def worker(self, name: str):
        return load_or_create_key(self.tmp / "nodes" / name / "node.key")

    def call(self, key, method: str, path: str, body=None, params=None, raw: bytes | None = None):
        content = raw if raw is not None else (b"" if body is None else json.dumps(body).encode())
        req = self.http.build_request(method, path, params=params, content=content)
        target = req.url.raw_path.decode()
        headers = sign_request(key, self.svc.run_id, method, target, content, now=self.clock())
        req.headers.update(headers)
        req.headers["content-type"] = "application/json"
        return self.http.send(req)

    def ok(self, key, method, path, body=None, params=None) -> dict:
        r = self.call(key, method, path, body, params)
        assert r.status_code == 200, (path, r.status_code, r.text)
        return r.json()

    def register(self, key, hardware=None) -> dict:
        return self.ok(
            key, "POST", "/v1/nodes/register", {"role": "worker", "hardware": hardware or HW}
        )

    def open_step(self, step: int, policy: int) -> None:
        self.ok(self.trainer, "POST", "/v1/trainer/step", {"step": step})
        self.ok(self.trainer, "POST", "/v1/trainer/published", {"version": policy})

    def assignment(self, key, policy: int) -> dict:
        hb = self.ok(
            key, "POST", "/v1/nodes/heartbeat", {"policy_version": policy, "want_work": True}
        )
        return hb

    def upload(self, key, counter: int, data: bytes) -> dict:
        import hashlib

        sha = hashlib.sha256(data).hexdigest()
        g = self.ok(
            key, "POST", "/v1/uploads", {"counter": counter, "size": len(data), "sha256": sha}
        )
        r = self.http.put(g["url"].removeprefix("http://testserver"), content=data)
        assert r.status_code == 200, r.text
        self.ok(key, "POST", "/v1/submit", {"key": g["key"], "sha256": sha})
        return g

    def ledger(self) -> dict:
        return {n["key"]: n for n in self.http.get("/v1/ledger").json()["nodes"]}

    def snapshot(self) -> list:
        """Every row of every table but nonces: what a refused call must not change."""
        out = []
        with self.svc.db.tx() as cur:
            for table in ("meta", "counters", "nodes", "assignments", "files", "steps", "events"):
                out.append(sorted(map(tuple, cur.execute(f"SELECT * FROM {table}").fetchall())))
        return out


@pytest.fixture(scope="session")
def postgres_url():
    """A real PostgreSQL server for the session (initdb + pg_ctl on a loopback port).
    PostgreSQL refuses to run as root; as root it runs as the `postgres` user."""
    import os
    import pwd
    import tempfile

    found = sorted(Path("/usr/lib/postgresql").glob("*/bin"))  # Debian keeps them off PATH
    search = os.pathsep.join([os.environ.get("PATH", ""), *map(str, found)])
    initdb, pg_ctl = shutil.which("initdb", path=search), shutil.which("pg_ctl", path=search)
    if not initdb or not pg_ctl:
        pytest.skip("PostgreSQL server binaries (initdb, pg_ctl) not found: apt install postgresql")
    as_user: list[str] = []
    d = Path(tempfile.mkdtemp(prefix="swarmrl-pg-"))
    if os.geteuid() == 0:
        try:
            pg = pwd.getpwnam("postgres")
        except KeyError:
            pytest.skip("running as root and there is no 'postgres' user to run the server as")
        os.chown(d, pg.pw_uid, pg.pw_gid)
        as_user = ["runuser", "-u", "postgres", "--"]
    data = d / "data"
    subprocess.run([*as_user, initdb, "-D", str(data), "-U", "swarm", "--auth=trust", "-E", "UTF8"],
                   check=True, capture_output=True)  # fmt: skip
    port = free_port()
    subprocess.run(
        [*as_user, pg_ctl, "-D", str(data), "-l", str(d / "log"), "-w", "-o",
         f"-p {port} -k {d} -c listen_addresses=127.0.0.1 -c fsync=off", "start"],
        check=True, capture_output=True,
    )  # fmt: skip
    try:
        yield f"postgresql://swarm@127.0.0.1:{port}"
    finally:
        subprocess.run([*as_user, pg_ctl, "-D", str(data), "-m", "immediate", "stop"],
                       capture_output=True)  # fmt: skip
        shutil.rmtree(d, ignore_errors=True)


def new_pg_database(base: str, name: str) -> str:
    import psycopg

    with psycopg.connect(base + "/postgres", autocommit=True) as c:
        c.execute(f'DROP DATABASE IF EXISTS "{name}"')
        c.execute(f'CREATE DATABASE "{name}"')
    return f"{base}/{name}"


def pubhex(key) -> str:
    return public_key_hex(key)
