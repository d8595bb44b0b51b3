"""Version manifests: what a complete policy version holds.

`manifest.json` lists every file with its size, sha256 and per-shard sha256
(shards of `shard_bytes`, 50 MB by default), and is written last, atomically
(temp file + rename): a version is complete exactly when its manifest exists.

A version may also carry patches (protocol/patch.py): `patches` lists, for a
base version, the whole-file sha256 of each of the base's files and the patch
file (a `FileEntry` with its shards, like any file: `<name>.patch`, served and
hash-checked shard by shard). `files` always describes the full version, which
is what a patch must rebuild. A manifest without patches is signed exactly as
before patches existed.

A version may instead be an adapter (LoRA, `trainer.lora`): its files are a peft
adapter (`adapter_model.safetensors`, `adapter_config.json`), and `base` names the
version it adapts and the whole-file sha256 of each of that version's files. A
node runs base + adapter merged (shardcast/adapter.py) and holds the base as long
as versions name it. A manifest without `base` is signed as before it existed.

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
PATCH_SUFFIX = ".patch"
MAX_PATCHES = 8
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


class PatchEntry(BaseModel):
    """A patch that rebuilds this version from `base_version`, whose files had the
    whole-file sha256 `base_files` (by name)."""

    model_config = ConfigDict(extra="forbid")
    base_version: int = Field(ge=0)
    base_files: dict[str, str] = Field(max_length=10_000)
    file: FileEntry

    def base_matches(self, base: Manifest) -> bool:
        return base.version == self.base_version and self.base_files == {
            f.name: f.sha256 for f in base.files
        }


class AdapterBase(BaseModel):
    """The version an adapter version adapts, and its files' whole-file sha256 by name."""

    model_config = ConfigDict(extra="forbid")
    version: int = Field(ge=0)
    files: dict[str, str] = Field(max_length=10_000)

    def matches(self, base: Manifest) -> bool:
        return base.version == self.version and self.files == {f.name: f.sha256 for f in base.files}


class Manifest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    version: int = Field(ge=0)
    files: list[FileEntry]
    created: float
    signer: str = Field("", pattern=r"^([0-9a-f]{64})?$")
    signature: str = Field("", pattern=r"^([0-9a-f]{128})?$")
    patches: list[PatchEntry] = Field(default_factory=list, max_length=MAX_PATCHES)
    base: AdapterBase | None = None  # set: the files are an adapter over this version

    def file(self, name: str) -> FileEntry | None:
        """A file of the version or a patch file, by name."""
        every = [*self.files, *(p.file for p in self.patches)]
        return next((f for f in every if f.name == name), None)

    def patch_from(self, base: int) -> PatchEntry | None:
        return next((p for p in self.patches if p.base_version == base), None)

    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)

    def signing_payload(self) -> bytes:
        body = self.model_dump()
        body["signature"] = ""
        if not body["patches"]:  # signed as manifests were before patches existed
            del body["patches"]
        if body["base"] is None:  # and before adapter versions existed
            del body["base"]
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


def version_files(directory: Path) -> list[Path]:
    """The files of the version in `directory` (not its manifest, patches or temp files)."""
    return sorted(
        p
        for p in directory.iterdir()
        if p.is_file()
        and p.name != MANIFEST
        and not p.name.startswith(".")
        and not p.name.endswith(PATCH_SUFFIX)
    )


def write_manifest(
    directory: Path,
    version: int,
    shard_bytes: int = SHARD_BYTES,
    key: SigningKey | None = None,
    entries: list[FileEntry] | None = None,
    patches: list[PatchEntry] | None = None,
    base: AdapterBase | None = None,
) -> Manifest:
    """Hash (unless `entries` are given), sign and commit the version in `directory`."""
    files = version_files(directory)
    if entries is None:
        entries = [hash_file(p, shard_bytes) for p in files]
    manifest = Manifest(
        version=version, files=entries, created=time.time(), patches=patches or [], base=base
    )
    if key is not None:
        manifest = manifest.signed(key)
    _fsync_all(
        files + [directory / p.file.name for p in manifest.patches], directory
    )  # the data is durable before the manifest says "complete"
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
    patch_names = [p.file.name for p in m.patches]
    if (
        len(set(names + patch_names)) != len(names) + len(patch_names)
        or MANIFEST in names
        or any(n.endswith(PATCH_SUFFIX) for n in names)
        or not all(n.endswith(PATCH_SUFFIX) for n in patch_names)
        or len({p.base_version for p in m.patches}) != len(m.patches)
        or any(p.base_version >= m.version for p in m.patches)
        or (m.base is not None and (m.base.version >= m.version or m.patches))
    ):
        raise ManifestError(f"{where}: duplicate, reserved or misnamed files or patches")
    for f in [*m.files, *(p.file for p in m.patches)]:
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


def verify_version(
    directory: Path, trusted_key: str | None = None, patches: bool = False
) -> Manifest:
    """Check every listed file (with `patches`, the patch files too) against its size
    and sha256 (and, given a trusted key, the manifest's signature); raise ManifestError
    on any mismatch."""
    manifest = read_manifest(directory)
    if trusted_key is not None:
        manifest.check_signature(trusted_key)
    for entry in [*manifest.files, *(p.file for p in manifest.patches if patches)]:
        p = directory / entry.name
        if not p.is_file() or p.stat().st_size != entry.size:
            raise ManifestError(f"{p}: missing or wrong size (manifest says {entry.size} bytes)")
        got = hash_file(p)
        if got.sha256 != entry.sha256:
            raise ManifestError(f"{p}: sha256 mismatch")
    return manifest
