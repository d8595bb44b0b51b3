"""The orchestrator client every process uses: signed calls over HTTP (httpx).

Only outbound connections, so a worker behind NAT can join. A call that
cannot reach the orchestrator (connection refused, a 5xx, a timeout) is
retried with backoff for up to `patience_s` seconds, each time signed anew
(a fresh nonce): an orchestrator restart looks like a pause to the nodes.
A 4xx is not retried: it raises `OrchestratorError` with the server's reason.
"""

from __future__ import annotations

import json
import logging
import time

import httpx

from swarmrl.protocol.signing import sign_request

log = logging.getLogger("swarmrl.client")


class OrchestratorError(RuntimeError):
    def __init__(self, status: int, detail: str, path: str, retry_after_s: float | None = None):
        super().__init__(f"{path}: {status}: {detail}")
        self.status = status
        self.detail = detail
        self.retry_after_s = retry_after_s


class OrchestratorClient:
    def __init__(self, url: str, key, timeout_s: float = 30.0, patience_s: float = 300.0):
        self.url = url.rstrip("/")
        self.key = key
        self.http = httpx.Client(base_url=self.url, timeout=timeout_s)
        self._objects: httpx.Client | None = None  # `objects`, made on first use
        self.patience_s = patience_s
        self.run_id: str | None = None
        self._work: tuple | None = None  # ((run_id, bits), nonce) of register()

    def run_params(self) -> dict:
        params = self._send("GET", "/v1/run", signed=False)
        self.run_id = params["run_id"]
        return params

    def register(self, body: dict, invite: str = "", max_wait_s: float = 3600.0) -> dict:
        """POST /v1/nodes/register, paying what the run asks of a new key: the invitation
        if there is one, else the proof of work (solved once per run). While the run's
        faucet is empty (429) it waits as told, up to `max_wait_s` in all."""
        from swarmrl.protocol import work_proof
        from swarmrl.protocol.identity import public_key_hex

        params = self.run_params()
        bits = int(params.get("register_work_bits", 0))
        if invite:
            body = {**body, "invite": invite}
        elif bits:
            if self._work is None or self._work[0] != (self.run_id, bits):
                t0 = time.time()
                nonce = work_proof.solve(self.run_id, public_key_hex(self.key), bits)
                log.info("proof of work (%d bits) in %.1fs", bits, time.time() - t0)
                self._work = ((self.run_id, bits), nonce)
            body = {**body, "work": self._work[1]}
        give_up = time.time() + max_wait_s
        while True:
            try:
                return self.call("POST", "/v1/nodes/register", body)
            except OrchestratorError as e:
                wait = e.retry_after_s or 60.0
                if e.status != 429 or time.time() + wait > give_up:
                    raise
                log.warning("registration: %s; retrying in %.0fs", e.detail, wait)
                time.sleep(wait)

    def servers(self) -> list[str]:
        """The SHARDCAST servers the orchestrator advertises now."""
        return self._send("GET", "/v1/run/servers", signed=False)["servers"]

    def call(self, method: str, path: str, body: dict | None = None, params: dict | None = None):
        if self.run_id is None:
            self.run_params()
        return self._send(method, path, body, params, signed=True)

    def _send(self, method, path, body=None, params=None, signed=True):
        content = b"" if body is None else json.dumps(body).encode()
        deadline = time.time() + self.patience_s
        delay = 0.2
        while True:
            req = self.http.build_request(method, path, params=params, content=content)
            if body is not None:
                req.headers["Content-Type"] = "application/json"
            if signed:
                target = req.url.raw_path.decode("latin-1")
                req.headers.update(sign_request(self.key, self.run_id, method, target, content))
            try:
                resp = self.http.send(req)
            except httpx.TransportError as e:
                why = f"{type(e).__name__}: {e}"
            else:
                if resp.status_code < 400:
                    return resp.json()
                if resp.status_code < 500:
                    try:
                        detail = resp.json().get("detail", resp.text)
                    except ValueError:
                        detail = resp.text
                    after = resp.headers.get("Retry-After", "")
                    raise OrchestratorError(
                        resp.status_code,
                        str(detail),
                        path,
                        float(after) if after.isascii() and after.isdigit() else None,
                    )
                why = f"HTTP {resp.status_code}"
            # Recovered: the orchestrator is restarting or overloaded; try again.
            if time.time() > deadline:
                raise ConnectionError(
                    f"orchestrator {self.url} unreachable for {self.patience_s:.0f}s: {why}"
                )
            log.warning("orchestrator %s %s: %s; retrying in %.1fs", method, path, why, delay)
            time.sleep(delay)
            delay = min(delay * 2, 5.0)

    def _retrying(self, what: str, attempt):
        """`attempt()` until it returns, retrying transport errors and 5xx answers (the
        orchestrator serving the object store may be restarting) for `patience_s`."""
        deadline = time.time() + self.patience_s
        delay = 0.2
        while True:
            try:
                return attempt()
            except httpx.TransportError as e:
                why = f"{type(e).__name__}: {e}"
            except OrchestratorError as e:
                if e.status < 500:
                    raise
                why = f"HTTP {e.status}"
            # Recovered: retried like an API call (see the module docstring).
            if time.time() > deadline:
                raise ConnectionError(f"{what} failed for {self.patience_s:.0f}s: {why}")
            log.warning("%s: %s; retrying in %.1fs", what, why, delay)
            time.sleep(delay)
            delay = min(delay * 2, 5.0)

    @property
    def objects(self) -> httpx.Client:
        """The client for signed object URLs (the orchestrator's store or S3), kept from
        file to file with its connections: `httpx.put` made a client per file, and its
        TLS context (the CA bundle read again) was a fifth of an emulated worker's CPU
        (py-spy)."""
        if self._objects is None:
            self._objects = httpx.Client(timeout=120.0)
        return self._objects

    def get_bytes(self, url: str, limit: int) -> bytes:
        """Download a signed object URL, refusing more than `limit` bytes."""

        def attempt() -> bytes:
            with self.objects.stream("GET", url, timeout=60.0) as resp:
                if resp.status_code != 200:
                    detail = resp.read().decode(errors="replace")[:300]
                    raise OrchestratorError(resp.status_code, detail, "download")
                chunks, n = [], 0
                for chunk in resp.iter_bytes():
                    n += len(chunk)
                    if n > limit:
                        raise OrchestratorError(413, f"object over {limit} bytes", "download")
                    chunks.append(chunk)
            return b"".join(chunks)

        return self._retrying("download", attempt)

    def put_bytes(self, url: str, data: bytes, headers: dict | None = None) -> None:
        def attempt() -> None:
            resp = self.objects.put(url, content=data, headers=headers or {}, timeout=120.0)
            if resp.status_code >= 300:
                raise OrchestratorError(resp.status_code, resp.text[:300], "upload")

        self._retrying("upload", attempt)

    def close(self) -> None:
        self.http.close()
        if self._objects is not None:
            self._objects.close()
