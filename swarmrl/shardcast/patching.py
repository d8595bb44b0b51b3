"""A Follower's patches (shardcast/client.py): which chain of patches takes a node
from the newest version it holds to the one announced, and applying one to the
held base (protocol/patch.py builds and checks them)."""

from __future__ import annotations

from pathlib import Path

from swarmrl.protocol.manifest import Manifest, ManifestError, read_manifest
from swarmrl.protocol.patch import apply_patch

MAX_CHAIN = 16  # patches walked at most to catch up; further behind takes the files


async def patch_route(follower, session, manifest: Manifest, raw: bytes) -> list:
    """[(manifest, raw, patch)] from the newest version held to `manifest`'s, one
    patch each, when that is fewer bytes than the full version; else []."""
    have = follower.local.versions()
    if not follower.patches or not have or not manifest.patches:
        return []
    try:
        held = read_manifest(follower.local.path(have[-1]))
    except (OSError, ManifestError):  # recovered: a version we cannot read is no base
        return []
    chain: list = [(manifest, raw)]
    while chain[0][0].version > held.version + 1 and len(chain) <= MAX_CHAIN:
        v = chain[0][0].version - 1
        if v not in follower._announced():
            return []
        got = await follower._fetch_manifest(session, v, give_up=False)
        if got is None:
            return []
        chain.insert(0, got)
    route, before, size = [], held, 0
    for m, r in chain:
        patch = m.patch_from(before.version)
        if patch is None or not patch.base_matches(before):
            return []
        route.append((m, r, patch))
        size += patch.file.size
        before = m
    return route if size < manifest.total_bytes() else []


def apply_to_held(local, manifest: Manifest, patch, d: Path) -> None:
    """Rebuild `manifest`'s files in `d` from the held base the patch names."""
    base = local.path(patch.base_version)
    expect = [(f.name, f.size, f.sha256) for f in manifest.files]
    local.pinned = patch.base_version  # retention must not delete the base meanwhile
    try:
        apply_patch(
            d / patch.file.name, base, patch.base_version, patch.base_files,
            manifest.version, expect, d,
        )  # fmt: skip
    finally:
        local.pinned = None
