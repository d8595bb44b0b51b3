"""`swarmrl fetch`: one policy version, downloaded once through SHARDCAST."""

from __future__ import annotations

import asyncio
from pathlib import Path

from swarmrl.shardcast.client import Fetched, Follower


def fetch_report(got: Fetched) -> dict:
    """What `swarmrl fetch` prints: the download, with this process's peak memory and CPU time."""
    import resource

    use = resource.getrusage(resource.RUSAGE_SELF)
    return {
        **got.__dict__,
        "peak_rss_MB": use.ru_maxrss / 1024,
        "cpu_s": use.ru_utime + use.ru_stime,
        "cpu_user_s": use.ru_utime,
        "ctx_switches": use.ru_nvcsw + use.ru_nivcsw,
    }


async def fetch_once(
    servers: list[str],
    trusted_key: str,
    root: Path,
    min_version: int = 0,
    parallel: int = 2,
    timeout_s: float | None = None,
    direct_io: bool = True,
) -> Fetched:
    """Wait for a version >= `min_version`, download it into `root`, and return.
    The engine of `swarmrl fetch` (one-off downloads, benchmarks, debugging)."""
    got: list[Fetched] = []
    stop = asyncio.Event()

    def fetched(f: Fetched) -> None:
        if f.version >= min_version:
            got.append(f)
            stop.set()

    follower = Follower(
        servers, trusted_key, root, parallel=parallel, direct_io=direct_io, on_fetched=fetched
    )
    await asyncio.wait_for(follower.run(stop), timeout_s)
    return got[0]
