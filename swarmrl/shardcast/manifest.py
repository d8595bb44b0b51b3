"""Version manifests: what a complete policy version holds.

`manifest.json` lists every file with its size, sha256 and per-shard sha256
(shards of `shard_bytes`, 50 MB by default), and is written last, atomically
(temp file + rename): a version is complete exactly when its manifest exists.
`signer` and `signature` are empty until SHARDCAST signs manifests (issue 3);
`verify_version` checks sizes and hashes, not signatures, for now.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

MANIFEST = "manifest.json"
SHARD_BYTES = 50 * 1000 * 1000
MAX_MANIFEST_BYTES = 1 << 20


class ManifestError(RuntimeError):
    pass


class Shard(BaseModel):
    model_config = ConfigDict(extra="forbid")
    offset: int = Field(ge=0)
    size: int = Field(ge=0)
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")


class FileEntry(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(pattern=r"^[A-Za-z0-9_.-]+$", max_length=255)
    size: int = Field(ge=0)
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    shards: list[Shard]


class Manifest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    version: int = Field(ge=0)
    files: list[FileEntry]
    created: float
    signer: str = ""
    signature: str = ""


def hash_file(path: Path, shard_bytes: int = SHARD_BYTES) -> FileEntry:
    whole = hashlib.sha256()
    shards = []
    offset = 0
    with open(path, "rb") as f:
        while True:
            chunk = f.read(shard_bytes)
            if not chunk and offset > 0:
                break
            whole.update(chunk)
            shards.append(
                Shard(offset=offset, size=len(chunk), sha256=hashlib.sha256(chunk).hexdigest())
            )
            offset += len(chunk)
            if len(chunk) < shard_bytes:
                break
    return FileEntry(name=path.name, size=offset, sha256=whole.hexdigest(), shards=shards)


def write_json_atomic(path: Path, data: dict) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "w") as f:
        json.dump(data, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def write_manifest(directory: Path, version: int, shard_bytes: int = SHARD_BYTES) -> Manifest:
    files = sorted(
        p
        for p in directory.iterdir()
        if p.is_file() and p.name != MANIFEST and not p.name.startswith(".")
    )
    manifest = Manifest(
        version=version, files=[hash_file(p, shard_bytes) for p in files], created=time.time()
    )
    write_json_atomic(directory / MANIFEST, manifest.model_dump())
    return manifest


def read_manifest(directory: Path) -> Manifest:
    path = directory / MANIFEST
    if path.stat().st_size > MAX_MANIFEST_BYTES:
        raise ManifestError(f"{path}: manifest larger than {MAX_MANIFEST_BYTES} bytes")
    try:
        return Manifest.model_validate_json(path.read_bytes())
    except ValueError as e:
        raise ManifestError(f"{path}: malformed manifest: {e}") from None


def verify_version(directory: Path) -> Manifest:
    """Check every listed file against its size and sha256; raise on mismatch."""
    manifest = read_manifest(directory)
    for entry in manifest.files:
        p = directory / entry.name
        if not p.is_file() or p.stat().st_size != entry.size:
            raise ManifestError(f"{p}: missing or wrong size (manifest says {entry.size} bytes)")
        got = hash_file(p)
        if got.sha256 != entry.sha256:
            raise ManifestError(f"{p}: sha256 mismatch")
    return manifest
