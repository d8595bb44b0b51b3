"""Policy versions in a local directory: `<root>/step_<n>/` (the embedded default).

The trainer writes the HF files of version n into `step_<n>/`, then the
manifest (last, atomic). Readers consider only directories with a manifest.
Retention keeps the newest `keep` versions and deletes older ones; a reader that
loses a race with deletion gets FileNotFoundError and looks again.

Patches (protocol/patch.py): with `patch_max_fraction` > 0, version n also
carries a patch from the version published before it, when that one is still
here and the patch is at most that fraction of the full version's bytes; every
`anchor_every`-th version carries none (an anchor). The full files are always
written: a node that holds the base takes the patch, any other the files.
Anchors bound the chain of patches a node that fell behind would walk; past
an anchor it takes the anchor's full files.

Adapter versions (`trainer.lora`): a version whose directory holds an adapter
(`adapter_config.json`) is published with `base` = `adapter_base` (version 0,
the full base model) in its manifest, and without patches: it is a few MB.
Retention never deletes a version that a kept version names as its base.
"""

from __future__ import annotations

import logging
import re
import shutil
import time
from pathlib import Path

from nacl.signing import SigningKey

from swarmrl.protocol.manifest import (
    MANIFEST,
    PATCH_SUFFIX,
    SHARD_BYTES,
    AdapterBase,
    Manifest,
    ManifestError,
    PatchEntry,
    hash_file,
    read_manifest,
    verify_version,
    version_files,
    write_manifest,
)

log = logging.getLogger("swarmrl.shardcast")

_VERSION_DIR = re.compile(r"^step_(\d{6,})$")


def version_dir_name(version: int) -> str:
    return f"step_{version:06d}"


class LocalWeights:
    """WeightsSink and WeightsSource over a directory."""

    def __init__(
        self,
        root: Path,
        keep: int = 3,
        key: SigningKey | None = None,
        shard_bytes: int = SHARD_BYTES,
        trusted_key: str | None = None,
        patch_max_fraction: float = 0.0,
        anchor_every: int = 0,
        adapter_base: int | None = None,
    ):
        self.root = Path(root)
        self.adapter_base = adapter_base  # the version adapter versions adapt
        self.patch_max_fraction = patch_max_fraction
        self.anchor_every = anchor_every
        self.last_patch: dict | None = None  # what the last publish did about a patch
        self.keep = keep
        self.key = key
        self.shard_bytes = shard_bytes
        self.trusted_key = trusted_key
        self.pinned: int | None = None  # a version in use by a reader: retention skips it
        self.root.mkdir(parents=True, exist_ok=True)

    # -- sink -------------------------------------------------------------
    def staging_dir(self, version: int) -> Path:
        d = self.root / version_dir_name(version)
        if (d / MANIFEST).exists():
            raise FileExistsError(f"version {version} is already published at {d}")
        if d.exists():  # a half-written version from a crashed trainer: redo it
            shutil.rmtree(d)
        d.mkdir(parents=True)
        return d

    def publish(self, version: int) -> Manifest:
        """Hash, shard, patch (module docstring), sign (when a key was given) and commit
        version; apply retention."""
        d = self.root / version_dir_name(version)
        entries = [hash_file(p, self.shard_bytes) for p in version_files(d)]
        base = self._adapter_base(version, d)
        patches = [] if base else self._patches(version, d, entries)
        manifest = write_manifest(d, version, self.shard_bytes, self.key, entries, patches, base)
        self.retain()
        return manifest

    def _adapter_base(self, version: int, d: Path) -> AdapterBase | None:
        """The base an adapter version names (None for a full version)."""
        from swarmrl.shardcast.adapter import ADAPTER_CONFIG

        if not (d / ADAPTER_CONFIG).exists():
            return None
        if self.adapter_base is None or self.adapter_base >= version:
            raise ManifestError(f"version {version} is an adapter, but no base version is set")
        held = read_manifest(self.path(self.adapter_base))
        return AdapterBase(version=held.version, files={f.name: f.sha256 for f in held.files})

    def _patches(self, version: int, d: Path, entries) -> list[PatchEntry]:
        from swarmrl.protocol.patch import build_patch

        self.last_patch = None
        older = [v for v in self.versions() if v < version]
        if self.patch_max_fraction <= 0 or not older:
            return []
        if self.anchor_every and version % self.anchor_every == 0:
            self.last_patch = {"version": version, "anchor": True}
            return []
        base = older[-1]
        try:
            base_manifest = read_manifest(self.path(base))
        except (OSError, ManifestError) as e:  # recovered: this version goes without a patch
            log.warning("version %d: no patch (base %d unreadable: %s)", version, base, e)
            return []
        base_sha = {f.name: f.sha256 for f in base_manifest.files}
        out = d / f"from-{version_dir_name(base)}{PATCH_SUFFIX}"
        t0 = time.perf_counter()
        stats = build_patch(
            self.path(base), base, base_sha, d, version,
            [(e.name, e.size, e.sha256) for e in entries], out,
        )  # fmt: skip
        full = sum(e.size for e in entries)
        size = out.stat().st_size
        self.last_patch = {
            "version": version, "base": base, "bytes": size, "full_bytes": full,
            "build_s": round(time.perf_counter() - t0, 4), "anchor": False,
            "changed_words": stats.changed_words, "words": stats.words,
            "xor_bytes": stats.xor_bytes, "sparse_bytes": stats.sparse_bytes,
        }  # fmt: skip
        if size > self.patch_max_fraction * full:
            out.unlink()
            self.last_patch["dropped"] = True
            return []
        entry = PatchEntry(
            base_version=base, base_files=base_sha, file=hash_file(out, self.shard_bytes)
        )
        return [entry]

    def retain(self) -> list[int]:
        """Delete all but the newest `keep` versions and the bases they name; return the
        deleted ones."""
        versions = self.versions()
        kept = versions[max(0, len(versions) - self.keep) :]
        bases = {self.base_of(v) for v in kept} | {self.pinned}
        dropped = [v for v in versions[: max(0, len(versions) - self.keep)] if v not in bases]
        for v in dropped:
            self.delete(v)
        return dropped

    def delete(self, version: int) -> None:
        d = self.root / version_dir_name(version)
        # The manifest goes first, so a half-deleted version is never "complete".
        (d / MANIFEST).unlink(missing_ok=True)
        shutil.rmtree(d, ignore_errors=True)

    # -- source -----------------------------------------------------------
    def versions(self) -> list[int]:
        out = []
        for d in self.root.iterdir():
            m = _VERSION_DIR.match(d.name)
            if m and (d / MANIFEST).exists():
                out.append(int(m.group(1)))
        return sorted(out)

    def base_of(self, version: int) -> int | None:
        """The version that `version` adapts (None: a full version, or unreadable)."""
        try:
            base = read_manifest(self.path(version)).base
        except (OSError, ManifestError):
            return None
        return base.version if base else None

    def newest(self) -> int | None:
        v = self.versions()
        return v[-1] if v else None

    def path(self, version: int) -> Path:
        return self.root / version_dir_name(version)

    def open_verified(self, version: int) -> Path:
        d = self.path(version)
        verify_version(d, self.trusted_key)
        return d
