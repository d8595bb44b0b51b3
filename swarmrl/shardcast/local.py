"""Policy versions in a local directory: `<root>/step_<n>/` (the embedded default).

The trainer writes the HF files of version n into `step_<n>/`, then the
manifest (last, atomic). Readers consider only directories with a manifest.
Retention keeps the newest `keep` versions and deletes older ones; a reader that
loses a race with deletion gets FileNotFoundError and looks again.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

from nacl.signing import SigningKey

from swarmrl.protocol.manifest import (
    MANIFEST,
    SHARD_BYTES,
    Manifest,
    verify_version,
    write_manifest,
)

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
    ):
        self.root = Path(root)
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
        """Hash, shard, sign (when a key was given) and commit version; apply retention."""
        manifest = write_manifest(
            self.root / version_dir_name(version), version, self.shard_bytes, self.key
        )
        self.retain()
        return manifest

    def retain(self) -> list[int]:
        """Delete all but the newest `keep` versions; return the deleted ones."""
        versions = self.versions()
        dropped = [v for v in versions[: max(0, len(versions) - self.keep)] if v != self.pinned]
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

    def newest(self) -> int | None:
        v = self.versions()
        return v[-1] if v else None

    def path(self, version: int) -> Path:
        return self.root / version_dir_name(version)

    def open_verified(self, version: int) -> Path:
        d = self.path(version)
        verify_version(d, self.trusted_key)
        return d
