"""The SHARDCAST client: follow upstream servers, download versions shard by shard.

`Follower` is the engine shared by workers, validators and relays. It long-polls
every server's `/versions` (announce.py), and when a version newer than what it holds is
announced it fetches the manifest (rejected unless signed by the trusted
trainer key, for the version asked), then downloads the shards in parallel
straight into the files of `<root>/step_<n>/`, writing the manifest last.

Each shard goes to the server `ServerPool` (servers.py) picks. A broken
transfer resumes where it stopped, with `Range`, on the best other server, the
running sha256 carried over. A shard whose hash does not match, sent by one
server, marks that server (`bad_data`, reported through `on_bad_data`) and is
refetched from the start elsewhere; that server is not asked for that shard
again. A mismatch in bytes from several servers blames none of them: the
shard is refetched whole from one server.

Deadlines: no one server holds the follower longer than `deadline_s` of what
it is asked for, whatever it announces: GRACE_S (10 s), then MIN_BPS
(256 KB/s) of the largest answer allowed: a manifest (MAX_MANIFEST_BYTES, 1 MB)
within 14 s, a shard within 10 s + its size at MIN_BPS (205 s for 50 MB), a
`/versions` poll within `poll_wait_s` + 15 s on a task of its own. A version
that no server served a manifest for is given up on for FAILED_RETRY_S; a
server that announced it and did not serve it is not believed while it backs
off (servers.py), so announcing versions that do not exist costs the follower
one manifest deadline per backoff of the liar, not the newest real version.
With `follow_drops` (relays) a held version is deleted only on the say-so of
servers whose newest announced version is one whose signed manifest this
follower has verified (`_follow_drops`).

Patches (protocol/patch.py): a version whose manifest carries a patch from a
version this client holds is fetched as that patch (its shards, checked like
any shard), applied to the held version, and installed only once every
rebuilt file has the manifest's sha256. A client further behind fetches the
manifests in between and walks the chain of patches when the chain is fewer
bytes than the full version, installing each version on the way. A patch
that does not rebuild its version (a base that is not the one it names) is
given up for the full files. A server that sends a patch's bytes wrong is
caught by the shard hash and reported like any other (`bad_data`). An adapter
version (shardcast/adapter.py) is fetched after the base it names, when that
is not held. With
`mirror_patches` (relays) the patch files are fetched along with the full
files, so that the relay can serve them on.

Memory: shard bodies go from the socket into one 1 MB buffer per connection
(fastget.py) and from there to `pwrite` and the hash, so a client holds a few
MB of buffers whatever the checkpoint size. Files are not fsynced: a version
torn by a crash fails the whole-file check before it is loaded. The
whole-file sha256 is not recomputed here: the per-shard hashes, all signed,
cover every byte; `LocalWeights.open_verified` re-checks whole files before a
worker loads a version.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

from swarmrl.protocol.manifest import (
    MANIFEST,
    MAX_MANIFEST_BYTES,
    FileEntry,
    Manifest,
    ManifestError,
    Shard,
    parse_manifest,
)
from swarmrl.protocol.patch import PatchError
from swarmrl.shardcast.adapter import hold_base
from swarmrl.shardcast.announce import POLL_WAIT_S, Announcements, BadBody, BadStatus, read_limited
from swarmrl.shardcast.fastget import FastGet
from swarmrl.shardcast.local import LocalWeights
from swarmrl.shardcast.patching import apply_to_held, patch_route
from swarmrl.shardcast.seed import seed_for, take_seeded
from swarmrl.shardcast.servers import ServerPool, ShardcastError
from swarmrl.shardcast.writer import ShardWriter, open_direct

log = logging.getLogger("swarmrl.shardcast.client")

CHUNK = 4 << 20
MAX_SHARD_ATTEMPTS = 12
FAILED_RETRY_S = 10.0  # a version given up on is tried again after this long
GRACE_S = 10.0  # every request for a manifest or a shard gets this long, and then:
MIN_BPS = 256 * 1024  # slower than this counts as a failure (the server is cut off)
PROGRESS_STEP = 4 << 20  # a relay streams in-flight shards onward in steps of this size


def deadline_s(nbytes: int) -> float:
    """How long one server may take to send `nbytes`: GRACE_S, then MIN_BPS."""
    return GRACE_S + nbytes / MIN_BPS


class _LocalWriteError(RuntimeError):
    """Our own disk failed: not the server's fault."""


@dataclass
class _ShardState:
    """A shard being downloaded: bytes so far and their running hash (kept across
    a Range resume on another server)."""

    writer: ShardWriter
    pos: int = 0
    reported: int = 0
    hasher: object = field(default_factory=hashlib.sha256)


@dataclass
class Fetched:
    version: int
    seconds: float
    bytes: int  # downloaded for this version
    latency_s: float  # from the manifest's creation (publish) to having the version
    full_bytes: int = 0  # the version's files
    patched_from: int | None = None  # the version its patch was applied to


ProgressFn = Callable[[int, str, int, int], None]


class Follower(Announcements):
    """Mirror the newest versions announced by `servers` into `root`.

    Hooks (all called on the follower's event loop) let a relay serve what is
    in flight: `on_manifest(manifest, bytes, dir)` before any shard arrives,
    `on_progress(version, file, shard, nbytes)` as bytes land,
    `on_complete(version)` once the manifest is written, `on_drop(version)`
    when a version is deleted; `on_bad_data(url, what)` reports a server that
    sent a bad shard or manifest (to the orchestrator, once it exists).
    With `every`, versions are fetched oldest first instead of skipping to
    the newest (a validator needs each version that rollouts may claim).
    With `servers_from` (a blocking call, run on a thread every `refresh_s`),
    the list of servers is followed as it changes: a worker asks the
    orchestrator, which adds relays as they register and drops those reported
    bad. A failed or empty answer keeps the current list.
    """

    def __init__(
        self,
        servers: list[str],
        trusted_key: str,
        root: Path,
        keep: int = 2,
        parallel: int = 4,
        follow_drops: bool = False,
        every: bool = False,
        direct_io: bool = False,
        poll_wait_s: float = POLL_WAIT_S,
        on_manifest: Callable[[Manifest, bytes, Path], None] | None = None,
        on_progress: ProgressFn | None = None,
        on_complete: Callable[[int], None] | None = None,
        on_drop: Callable[[int], None] | None = None,
        on_fetched: Callable[[Fetched], None] | None = None,
        on_bad_data: Callable[[str, str], None] | None = None,
        servers_from: Callable[[], list[str]] | None = None,
        refresh_s: float = 30.0,
        patches: bool = True,
        mirror_patches: bool = False,
    ):
        self.server_urls = servers
        self.servers_from = servers_from
        self.refresh_s = refresh_s
        self.trusted_key = trusted_key
        self.local = LocalWeights(root, keep=keep, trusted_key=trusted_key)
        self.parallel = parallel
        self.follow_drops = follow_drops
        self.every = every  # fetch every announced version in order, not only the newest
        self.direct_io = direct_io
        self.poll_wait_s = poll_wait_s
        self.on_manifest = on_manifest
        self.on_progress = on_progress
        self.on_complete = on_complete
        self.on_drop = on_drop
        self.on_fetched = on_fetched
        self.on_bad_data = on_bad_data
        self.patches = patches  # take a patch when it is fewer bytes
        self.mirror_patches = mirror_patches  # fetch patch files with the full files
        self.pool: ServerPool | None = None
        self.fastget = FastGet()
        self.failed: dict[int, str] = {}  # versions given up on, with the reason
        self._failed_at: dict[int, float] = {}
        self._verified: set[int] = set()  # versions whose signed manifest checked out here
        self.in_flight: int | None = None
        # version -> a directory of files this node made itself (seed.py): those with the
        # signed manifest's sha256 are taken instead of fetched; None while they are being
        # made (the follower waits for them); set from any thread
        self.seeds: dict[int, Path] = {}

    # -- main loop ----------------------------------------------------------
    async def run(self, stop: asyncio.Event | None = None) -> None:
        stop = stop or asyncio.Event()
        self.pool = ServerPool(self.server_urls, self.on_bad_data)
        conn = aiohttp.TCPConnector(limit=0, force_close=False)
        async with aiohttp.ClientSession(connector=conn, read_bufsize=CHUNK) as session:
            polls = {
                s.url: asyncio.create_task(self._poll(session, s))
                for s in self.pool.servers.values()
            }
            refresher = None
            if self.servers_from is not None:
                refresher = asyncio.create_task(self._refresh(session, polls))
            try:
                while not stop.is_set():
                    self.pool.changed.clear()
                    have = self.local.versions()
                    announced = self._announced()
                    if self.follow_drops:
                        self._follow_drops()
                    now = time.monotonic()
                    todo = [
                        v
                        for v in announced
                        if (not have or v > have[-1])
                        and now - self._failed_at.get(v, -FAILED_RETRY_S) >= FAILED_RETRY_S
                    ]
                    if todo:
                        # 3: a stop interrupts a download in progress
                        nxt = min(todo) if self.every else max(todo)
                        fetch = asyncio.create_task(self._fetch(session, nxt))
                        stopper = asyncio.create_task(stop.wait())
                        await asyncio.wait([fetch, stopper], return_when=asyncio.FIRST_COMPLETED)
                        stopper.cancel()
                        if not fetch.done():
                            fetch.cancel()
                        await asyncio.gather(fetch, return_exceptions=True)
                        if fetch.done() and not fetch.cancelled() and fetch.exception():
                            raise fetch.exception()
                        continue
                    waiter = asyncio.create_task(self.pool.changed.wait())
                    stopper = asyncio.create_task(stop.wait())
                    await asyncio.wait(
                        [waiter, stopper], timeout=1.0, return_when=asyncio.FIRST_COMPLETED
                    )
                    waiter.cancel()
                    stopper.cancel()
            finally:
                tasks = [*polls.values(), *([refresher] if refresher else [])]
                for t in tasks:
                    t.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
                self.fastget.close()

    def _fail(self, version: int, why: str) -> None:
        self.failed[version] = why
        self._failed_at[version] = time.monotonic()

    def _follow_drops(self) -> None:
        """A relay deletes versions older than everything its upstreams still serve,
        counting only the upstreams whose newest announced version is genuine (held,
        or its signed manifest verified here): a server that announces versions that do
        not exist says nothing about what the others serve, and one that cannot be
        reached (it announces nothing) deletes nothing."""
        held = self.local.versions()
        genuine = self._verified.union(held)
        vouched = [s.versions for s in self.pool.servers.values()
                   if s.versions and s.versions[-1] in genuine]  # fmt: skip
        if not vouched:
            return
        oldest = min(vs[0] for vs in vouched)
        for v in held:
            if v < oldest:
                self._delete(v)

    def _delete(self, v: int) -> None:
        self.local.delete(v)
        if self.on_drop:
            self.on_drop(v)

    async def _fetch(self, session: aiohttp.ClientSession, version: int) -> None:
        self.in_flight = version
        try:
            got = await self._fetch_manifest(session, version)
            if got is None or not await hold_base(self, session, got[0]):
                return
            for m, raw, patch in await patch_route(self, session, *got):
                if not await self._install(session, m, raw, patch):
                    break
                if m.version == version:
                    return
            await self._install(session, *got, None)
        finally:
            self.in_flight = None

    async def _install(self, session, manifest: Manifest, raw: bytes, patch) -> bool:
        """Fetch `manifest`'s version (from `patch` and the version it names, or whole)
        and install it; False when it could not be."""
        version = manifest.version
        t0 = time.time()
        d = self.local.staging_dir(version)
        if patch is not None:
            wanted = [patch.file]
        else:
            wanted = [*manifest.files, *(p.file for p in manifest.patches if self.mirror_patches)]
        seed = await seed_for(self.seeds, version) if patch is None else None
        seeded = 0
        try:
            if seed is not None:
                wanted, seeded = await asyncio.to_thread(take_seeded, manifest, seed, d, wanted)
            await self._fetch_shards(session, manifest, raw, d, wanted)
            if patch is not None:
                await asyncio.to_thread(apply_to_held, self.local, manifest, patch, d)
        except (ShardcastError, PatchError) as e:
            if isinstance(e, PatchError):
                log.warning("version %d: patch from %d refused (%s); fetching the files",
                            version, patch.base_version, e)  # fmt: skip
            else:
                log.error("version %d: %s; trying it again later", version, e)
                self._fail(version, str(e))
            shutil.rmtree(d, ignore_errors=True)
            if self.on_drop:
                self.on_drop(version)
            return False
        tmp = d / f".{MANIFEST}.tmp"
        tmp.write_bytes(raw)
        os.replace(tmp, d / MANIFEST)
        now = time.time()
        fetched = Fetched(
            version, now - t0, sum(f.size for f in wanted), now - manifest.created,
            manifest.total_bytes(), patch.base_version if patch else None,
        )  # fmt: skip
        log.info(
            "version %d: %.1f MB%s%s in %.2fs (%.2fs after publish); servers %s",
            version,
            fetched.bytes / 1e6,
            f" (patch from {patch.base_version})" if patch else "",
            f" (and {seeded / 1e6:.1f} MB from the base this node holds)" if seeded else "",
            fetched.seconds,
            fetched.latency_s,
            self.pool.snapshot(),
        )
        if self.on_complete:
            self.on_complete(version)
        for v in [v for v in self.seeds if v < version]:  # a late joiner's: never needed
            shutil.rmtree(self.seeds.pop(v), ignore_errors=True)
        for v in self.local.retain():
            if self.on_drop:
                self.on_drop(v)
        if self.on_fetched:
            self.on_fetched(fetched)
        return True

    async def _fetch_manifest(
        self, session: aiohttp.ClientSession, version: int, give_up: bool = True
    ) -> tuple[Manifest, bytes] | None:
        tried: set[str] = set()
        while True:
            s = self.pool.pick(version, tried)
            if s is None:
                wait = self.pool.next_ready_in(version, tried)
                if wait is None or tried or wait > 2.0:
                    # Every announcing server was tried, or all are backing off: do not wait
                    # here (a flood of fake announcements must not stall real versions).
                    if give_up:
                        self._fail(version, "no server served a valid manifest")
                    return None
                await asyncio.sleep(wait)
                continue
            tried.add(s.url)
            try:
                async with asyncio.timeout(deadline_s(MAX_MANIFEST_BYTES)):
                    async with session.get(f"{s.url}/v/{version}/manifest.json") as r:
                        if r.status != 200:
                            raise BadStatus(f"HTTP {r.status}")
                        raw = await read_limited(r, MAX_MANIFEST_BYTES, "manifest")
            except BadBody as e:
                s.broke_promise = True  # it announced the version: servers.py
                self.pool.bad_data(s, f"manifest {version}: {e}")
                continue
            except (aiohttp.ClientError, TimeoutError, BadStatus) as e:
                s.broke_promise = True
                self.pool.failure(s, f"manifest {version}: {type(e).__name__}: {e}")
                continue
            try:
                manifest = parse_manifest(raw, f"{s.url} version {version}")
                manifest.check_signature(self.trusted_key)
                if manifest.version != version:
                    raise ManifestError(
                        f"{s.url}: asked for version {version}, manifest is {manifest.version}"
                    )
            except ManifestError as e:
                s.broke_promise = True
                self.pool.bad_data(s, str(e))
                continue
            s.broke_promise = False
            self._verified.add(version)
            return manifest, raw

    async def _fetch_shards(
        self, session, manifest: Manifest, raw: bytes, d: Path, wanted: list[FileEntry]
    ) -> None:
        fds: dict[str, tuple[int, int | None]] = {}
        try:
            for fe in wanted:
                fd = os.open(d / fe.name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
                os.ftruncate(fd, fe.size)
                fds[fe.name] = (fd, open_direct(d / fe.name) if self.direct_io else None)
            if self.on_manifest:  # a relay announces the version now, shards in flight
                self.on_manifest(manifest, raw, d)
            queue: asyncio.Queue[tuple[FileEntry, int, Shard]] = asyncio.Queue()
            for fe in wanted:
                for i, sh in enumerate(fe.shards):
                    queue.put_nowait((fe, i, sh))

            async def worker() -> None:
                while not queue.empty():
                    fe, i, sh = queue.get_nowait()
                    await self._fetch_shard(session, manifest.version, fe, i, sh, fds[fe.name])

            tasks = [asyncio.create_task(worker()) for _ in range(max(1, self.parallel))]
            try:
                await asyncio.gather(*tasks)
            finally:
                for t in tasks:
                    t.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
        finally:
            for fd, direct_fd in fds.values():
                os.close(fd)
                if direct_fd is not None:
                    os.close(direct_fd)

    async def _fetch_shard(self, session, version, fe: FileEntry, index, sh: Shard, fds) -> None:
        st = _ShardState(writer=ShardWriter(*fds, sh.offset, sh.size))
        try:
            await self._fetch_shard_into(session, version, fe, index, sh, fds, st)
        finally:
            st.writer.close()

    async def _fetch_shard_into(self, session, version, fe, index, sh, fds, st) -> None:
        contributors: set[str] = set()
        excluded: set[str] = set()
        resume = True  # False after a mismatch with several senders: one sender per try
        attempts = 0
        while True:
            if st.pos == sh.size:
                if st.hasher.hexdigest() == sh.sha256:
                    return
                what = f"version {version} {fe.name} shard {index}: sha256 mismatch"
                if len(contributors) == 1:  # one sender: it is to blame
                    self.pool.bad_data(self.pool.servers[next(iter(contributors))], what)
                    excluded |= contributors
                else:
                    # Several senders (a resumed transfer): an honest server must not be
                    # blamed for another's bytes. Start over, one server per attempt.
                    log.warning("%s after a resumed transfer; refetching from one server", what)
                    resume = False
                st = self._restart(st, fds, sh, version, fe, index, contributors)
            s = self.pool.pick(version, excluded)
            if s is None:
                wait = self.pool.next_ready_in(version, excluded)
                if wait is None:
                    raise ShardcastError(f"{fe.name} shard {index}: no server left that has it")
                await asyncio.sleep(wait + 0.01)
                continue
            attempts += 1
            if attempts > MAX_SHARD_ATTEMPTS:
                raise ShardcastError(f"{fe.name} shard {index}: {attempts - 1} failed attempts")
            if not resume and st.pos:
                st = self._restart(st, fds, sh, version, fe, index, contributors)
            contributors.add(s.url)
            s.active += 1
            t0, start = time.monotonic(), st.pos
            try:
                async with asyncio.timeout(deadline_s(sh.size - st.pos)):
                    await self._stream(session, s, version, fe, index, sh, st)
            except _LocalWriteError as e:
                raise ShardcastError(f"{fe.name} shard {index}: writing failed: {e}") from e
            except (aiohttp.ClientError, TimeoutError, BadStatus, OSError) as e:
                # Recovered: keep what arrived; resume with Range on the best server
                # (a server slower than MIN_BPS is cut off by the deadline).
                self.pool.failure(s, f"{fe.name}/{index}: {type(e).__name__}: {e}")
                continue
            finally:
                s.active -= 1
            self.pool.success(s, st.pos - start, time.monotonic() - t0)

    def _restart(self, st, fds, sh, version, fe, index, contributors) -> _ShardState:
        st.writer.close()
        contributors.clear()
        if self.on_progress:
            self.on_progress(version, fe.name, index, 0)
        return _ShardState(writer=ShardWriter(*fds, sh.offset, sh.size))

    async def _stream(self, session, s, version, fe, index, sh, st: _ShardState) -> None:
        headers = {"Range": f"bytes={st.pos}-"} if st.pos else {}
        url = f"{s.url}/v/{version}/{fe.name}/{index}"
        expect_status, expect_length = (206 if st.pos else 200), sh.size - st.pos

        def on_data(chunk) -> None:
            try:
                st.writer.write(chunk)
            except OSError as e:
                raise _LocalWriteError(str(e)) from e
            st.hasher.update(chunk)
            st.pos += len(chunk)
            if self.on_progress and (st.pos - st.reported >= PROGRESS_STEP or st.pos == sh.size):
                st.reported = st.pos
                self.on_progress(version, fe.name, index, st.pos)

        if self.fastget.supports(url):
            await self.fastget.get(url, headers, expect_status, expect_length, on_data)
            return
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=10, sock_read=60)
        async with session.get(url, headers=headers, timeout=timeout) as r:
            if r.status != expect_status:
                raise BadStatus(f"HTTP {r.status}")
            if r.content_length != expect_length:
                raise BadStatus(f"Content-Length {r.content_length}, expected {expect_length}")
            end = sh.size
            while st.pos < end:
                chunk = await r.content.readany()
                if not chunk:
                    raise BadStatus(f"connection closed at {st.pos}/{sh.size} bytes")
                if st.pos + len(chunk) > end:
                    raise BadStatus("more bytes than the shard holds")
                on_data(chunk)
