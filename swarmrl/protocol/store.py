"""Rollout store: object-store semantics (put, get, list, delete) over a directory.

Keys are slash-separated names (`exists` is a cheap stat); `put` writes a temp file and renames it, so
a reader never sees a partial object. Key names are validated (no absolute
paths, no '..'), because later they come from the network. An S3-compatible
implementation of the same four methods arrives with the orchestrator issue.
"""

from __future__ import annotations

import os
import re
import uuid
from pathlib import Path
from typing import Protocol

_KEY = re.compile(r"^[A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+)*$")


class RolloutStore(Protocol):
    def put(self, key: str, data: bytes) -> None: ...
    def get(self, key: str) -> bytes: ...
    def list(self, prefix: str) -> list[str]: ...
    def delete(self, key: str) -> None: ...
    def exists(self, key: str) -> bool: ...
    def size(self, key: str) -> int: ...


def check_key(key: str) -> str:
    if not _KEY.match(key) or any(part in (".", "..") for part in key.split("/")):
        raise ValueError(f"invalid store key {key!r}")
    return key


class LocalDirStore:
    def __init__(self, root: Path):
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)

    def _path(self, key: str) -> Path:
        return self.root / check_key(key)

    def put(self, key: str, data: bytes) -> None:
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.parent / f".{path.name}.{uuid.uuid4().hex}.tmp"
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)

    def get(self, key: str) -> bytes:
        return self._path(key).read_bytes()

    def list(self, prefix: str) -> list[str]:
        base = self.root / check_key(prefix.rstrip("/")) if prefix.strip("/") else self.root
        if not base.exists():
            return []
        keys = []
        for dirpath, _, files in os.walk(base):
            for name in files:
                key = str(Path(dirpath, name).relative_to(self.root))
                if not name.startswith(".") and _KEY.match(key):  # a name get() would refuse
                    keys.append(key)
        return sorted(keys)

    def size(self, key: str) -> int:
        return self._path(key).stat().st_size

    def delete(self, key: str) -> None:
        self._path(key).unlink(missing_ok=True)

    def exists(self, key: str) -> bool:
        return self._path(key).is_file()
