"""A hostile SHARDCAST relay, for the tests and the emulated swarm:
`python -m swarmrl.sim.hostile_relay --dir D --host H --port P`.

It speaks the API of shardcast/server.py over a real relay's directory D (the
genuine signed versions in D/step_NNNNNN/), and lies in every way it can without
the trainer's key, which it does not have:

- `/versions` announces the newest version in D, the one after it (which does
  not exist yet) and one far beyond (`FAR` more, a new one in every answer); it
  answers the first poll at once and holds every later one as long as the client
  asks (at most 60 s);
- `/v/N/manifest.json` for a version far beyond answers with the oldest genuine
  manifest in D (a replay: signed, but of another version); for another version
  it does not hold it sends nothing, holding the request until the client gives
  up; for a version it holds it sends the genuine manifest;
- every manifest and shard (genuine bytes, `Range` honoured) goes out at `bps`
  bytes a second (4 by default), the connection held open for as long as the
  client stays.

It cannot make a client accept a version that the trainer did not sign or bytes
that the manifest does not hash to: what it can do is waste a client's time and
claim versions exist. How the client bounds that is in docs/shardcast.md
("Hostile servers"); tests/unit/test_hostile_relay.py runs it against followers.
It records how long it held each request (`held`), so a test can check that no
client stayed past its deadline. With `--orchestrator URL` it keeps the relay's
registration alive (heartbeats with the relay's own key), so that only the
orchestrator's checks (orchestrator/relaycheck.py) and the nodes' reports can
delist it. A test fixture, not part of an honest run:
no command of the swarm starts it.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import time
from pathlib import Path

from aiohttp import web

from swarmrl.protocol.manifest import MANIFEST, Manifest, ManifestError, read_manifest
from swarmrl.shardcast.local import LocalWeights

FAR = 1_000_000  # how far beyond the newest genuine version its fakes go
TICK_S = 0.25  # it sends, or checks whether the client is gone, this often
MAX_HOLD_S = 600.0  # no request is held longer, client or not


class HostileRelay:
    """The server (see the module); `start()` gives its URL."""

    def __init__(self, root: Path, bps: float = 4.0):
        self.local = LocalWeights(root, keep=1 << 30)  # read only: retention never runs
        self.bps = bps
        self.answers = 0  # /versions answers so far: each brings a new fake version
        self.held: list[tuple[str, float]] = []  # (request path, seconds it was held)
        app = web.Application()
        app.add_routes([
            web.get("/health", self.health),
            web.get("/versions", self.versions),
            web.get(r"/v/{version:\d{1,12}}/manifest.json", self.manifest),
            web.get(r"/v/{version:\d{1,12}}/{name}/{index:\d{1,12}}", self.shard),
        ])  # fmt: skip
        self.runner = web.AppRunner(app, access_log=None, handle_signals=False,
                                    shutdown_timeout=0.1)  # fmt: skip

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> str:
        await self.runner.setup()
        site = web.TCPSite(self.runner, host, port, reuse_address=True)
        await site.start()
        return f"http://{host}:{site._server.sockets[0].getsockname()[1]}"

    async def stop(self) -> None:
        await self.runner.cleanup()

    def _genuine(self) -> dict[int, Manifest]:
        out = {}
        for v in self.local.versions():
            try:
                out[v] = read_manifest(self.local.path(v))
            except (OSError, ManifestError):  # deleted by its relay meanwhile
                pass
        return out

    def _announced(self) -> list[int]:
        newest = max(self._genuine(), default=-1)
        return sorted({v for v in (newest, newest + 1, newest + FAR + self.answers) if v >= 0})

    async def health(self, request: web.Request) -> web.Response:
        return web.json_response({"role": "relay", "versions": self._announced()})

    async def versions(self, request: web.Request) -> web.Response:
        if request.query.get("after", "-1") != "-1":  # held as long as the client asks
            await asyncio.sleep(min(max(float(request.query.get("wait", 0)), 0.0), 60.0))
        self.answers += 1
        return web.json_response({"versions": self._announced()})

    async def manifest(self, request: web.Request) -> web.StreamResponse:
        version = int(request.match_info["version"])
        genuine = self._genuine()
        if version in genuine:
            body = (self.local.path(version) / MANIFEST).read_bytes()
        elif genuine and version >= max(genuine) + FAR:  # a replay of the oldest
            body = (self.local.path(min(genuine)) / MANIFEST).read_bytes()
        else:
            return await self._nothing(request)
        return await self._trickle(request, 200, {}, body.__getitem__, 0, len(body))

    async def shard(self, request: web.Request) -> web.StreamResponse:
        manifest = self._genuine().get(int(request.match_info["version"]))
        name, index = request.match_info["name"], int(request.match_info["index"])
        files = [*manifest.files, *(p.file for p in manifest.patches)] if manifest else []
        fe = next((f for f in files if f.name == name), None)  # only names its manifest lists
        if fe is None or index >= len(fe.shards):
            return await self._nothing(request)
        sh = fe.shards[index]
        start, headers, status = 0, {}, 200
        if "Range" in request.headers:  # "bytes=a-", as clients resume
            start = int(request.headers["Range"].removeprefix("bytes=").split("-")[0])
            start = min(start, sh.size)
            headers = {"Content-Range": f"bytes {start}-{sh.size - 1}/{sh.size}"}
            status = 206
        with open(self.local.path(manifest.version) / fe.name, "rb") as f:

            def read(span: slice) -> bytes:
                f.seek(sh.offset + span.start)
                return f.read(span.stop - span.start)

            return await self._trickle(request, status, headers, read, start, sh.size)

    def _gone(self, request: web.Request, t0: float) -> bool:
        closing = request.transport is None or request.transport.is_closing()
        return closing or time.monotonic() - t0 > MAX_HOLD_S

    async def _trickle(self, request, status, headers, read, start, end) -> web.StreamResponse:
        """Send bytes [start, end) of what `read(slice)` gives at `bps`, until the
        client gives up."""
        t0 = time.monotonic()
        resp = web.StreamResponse(status=status, headers=headers)
        resp.content_length = end - start
        resp.content_type = "application/octet-stream"
        await resp.prepare(request)
        step = max(1, int(self.bps * TICK_S))
        pos = start
        try:
            while pos < end and not self._gone(request, t0):
                n = min(step, end - pos)
                await resp.write(read(slice(pos, pos + n)))
                pos += n
                await asyncio.sleep(n / self.bps)
            if pos == end:
                await resp.write_eof()
        except ConnectionError:  # the client gave up: what it is meant to do
            pass
        finally:
            self.held.append((request.path, time.monotonic() - t0))
        return resp

    async def _nothing(self, request: web.Request) -> web.Response:
        """No answer at all, for as long as the client waits for one."""
        t0 = time.monotonic()
        while not self._gone(request, t0):
            await asyncio.sleep(TICK_S)
        self.held.append((request.path, time.monotonic() - t0))
        return web.Response(status=404)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", type=Path, required=True, help="a real relay's directory")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--bps", type=float, default=4.0, help="bytes a second it sends")
    ap.add_argument("--orchestrator", help="keep the relay registered there, heartbeating with "
                    "its own key (DIR/node.key), as a liar that stays listed would")  # fmt: skip
    args = ap.parse_args(argv)
    if args.orchestrator:
        from swarmrl.shardcast.relay import join_orchestrator

        join_orchestrator(args.orchestrator, args.dir / "node.key",
                          f"http://{args.host}:{args.port}")  # fmt: skip

    async def serve() -> None:
        relay = HostileRelay(args.dir, args.bps)
        print(f"hostile relay at {await relay.start(args.host, args.port)}", flush=True)
        stop = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            asyncio.get_running_loop().add_signal_handler(sig, stop.set)
        await stop.wait()
        await relay.stop()

    asyncio.run(serve())


if __name__ == "__main__":
    main()
