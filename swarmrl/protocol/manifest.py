"""Version manifests: what a complete policy version holds.

`manifest.json` lists every file with its size, sha256 and per-shard sha256
(shards of `shard_bytes`, 50 MB by default), and is written last, atomically
(temp file + rename): a version is complete exactly when its manifest exists.

Signing: `signature` is the trainer's ed25519 signature (hex) of
`b"swarmrl-manifest-v1\n"` + the manifest as canonical JSON (sorted keys, no
spaces) with `signature` set to "". `signer` (the public key, hex) is inside
what is signed. A reader trusts a manifest only when `signer` equals the key it
was told to trust and the signature checks; the version number is signed too,
so an old manifest cannot be replayed under a newer version. Unsigned
manifests (signer "") exist only for local runs without SHARDCAST and for the
starting model built by `init-model`.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path

from nacl.signing import SigningKey
from pydantic import BaseModel, ConfigDict, Field

MANIFEST = "manifest.json"
SHARD_BYTES = 50 * 1000 * 1000
MAX_MANIFEST_BYTES = 1 << 20
SIGNING_CONTEXT = b"swarmrl-manifest-v1\n"


class ManifestError(RuntimeError):
    pass


class Shard(BaseModel):
    model_config = ConfigDict(extra="forbid")
    offset: int = Field(ge=0)
    size: int = Field(ge=0)
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")


class FileEntry(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(pattern=r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$", max_length=255)
    size: int = Field(ge=0)
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    shards: list[Shard]


class Manifest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    version: int = Field(ge=0)
    files: list[FileEntry]
    created: float
    signer: str = Field("", pattern=r"^([0-9a-f]{64})?$")
    signature: str = Field("", pattern=r"^([0-9a-f]{128})?$")

    def file(self, name: str) -> FileEntry | None:
        return next((f for f in self.files if f.name == name), None)

    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)

    def signing_payload(self) -> bytes:
        body = self.model_dump()
        body["signature"] = ""
        return SIGNING_CONTEXT + json.dumps(body, sort_keys=True, separators=(",", ":")).encode()

    def signed(self, key: SigningKey) -> Manifest:
        from swarmrl.protocol.identity import public_key_hex, sign

        m = self.model_copy(update={"signer": public_key_hex(key), "signature": ""})
        return m.model_copy(update={"signature": sign(key, m.signing_payload())})

    def check_signature(self, trusted_key: str) -> None:
        """Raise ManifestError unless `trusted_key` signed this manifest. Fails closed."""
        from swarmrl.protocol.identity import verify

        if not self.signature:
            raise ManifestError(f"manifest of version {self.version} is not signed")
        if self.signer != trusted_key.strip().lower():
            raise ManifestError(
                f"manifest of version {self.version} is signed by {self.signer[:16]}..., "
                f"not by the trusted trainer key {trusted_key[:16]}..."
            )
        if not verify(self.signer, self.signing_payload(), self.signature):
            raise ManifestError(f"manifest of version {self.version} has a bad signature")


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


def write_manifest(
    directory: Path,
    version: int,
    shard_bytes: int = SHARD_BYTES,
    key: SigningKey | None = None,
) -> Manifest:
    files = sorted(
        p
        for p in directory.iterdir()
        if p.is_file() and p.name != MANIFEST and not p.name.startswith(".")
    )
    manifest = Manifest(
        version=version, files=[hash_file(p, shard_bytes) for p in files], created=time.time()
    )
    if key is not None:
        manifest = manifest.signed(key)
    _fsync_all(files, directory)  # the data is durable before the manifest says "complete"
    write_json_atomic(directory / MANIFEST, manifest.model_dump())
    return manifest


def _fsync_all(files: list[Path], directory: Path) -> None:
    for p in files:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def parse_manifest(data: bytes, where: str = "manifest") -> Manifest:
    """Parse and validate manifest bytes: size limit, schema, shards tiling each file."""
    if len(data) > MAX_MANIFEST_BYTES:
        raise ManifestError(f"{where}: manifest larger than {MAX_MANIFEST_BYTES} bytes")
    try:
        m = Manifest.model_validate_json(data)
    except ValueError as e:
        raise ManifestError(f"{where}: malformed manifest: {e}") from None
    names = [f.name for f in m.files]
    if len(set(names)) != len(names) or MANIFEST in names:
        raise ManifestError(f"{where}: duplicate or reserved file names")
    for f in m.files:
        pos = 0
        for sh in f.shards:
            if sh.offset != pos:
                raise ManifestError(f"{where}: shards of {f.name} do not tile the file")
            pos += sh.size
        if pos != f.size or not f.shards:
            raise ManifestError(f"{where}: shards of {f.name} do not add up to its size")
    return m


def read_manifest(directory: Path) -> Manifest:
    path = directory / MANIFEST
    if path.stat().st_size > MAX_MANIFEST_BYTES:
        raise ManifestError(f"{path}: manifest larger than {MAX_MANIFEST_BYTES} bytes")
    return parse_manifest(path.read_bytes(), str(path))


def verify_version(directory: Path, trusted_key: str | None = None) -> Manifest:
    """Check every listed file against its size and sha256 (and, given a trusted
    key, the manifest's signature); raise ManifestError on any mismatch."""
    manifest = read_manifest(directory)
    if trusted_key is not None:
        manifest.check_signature(trusted_key)
    for entry in manifest.files:
        p = directory / entry.name
        if not p.is_file() or p.stat().st_size != entry.size:
            raise ManifestError(f"{p}: missing or wrong size (manifest says {entry.size} bytes)")
        got = hash_file(p)
        if got.sha256 != entry.sha256:
            raise ManifestError(f"{p}: sha256 mismatch")
    return manifest
