"""Where rollout files live: an object store reached through URLs the orchestrator signs.

The interface (`ObjectStore`) is what the orchestrator needs: a URL to upload
one object of a given size and sha256 before a deadline, a URL to download
it, its size once uploaded, and deletion. Workers, validators and the
trainer only ever see URLs, so none of them holds a store credential.

- `LocalObjectStore` (the default): a directory under the run, served by the
  orchestrator itself at `/objects/<key>` (orchestrator/app.py). A URL is
  valid only with its HMAC-SHA256 (a secret kept in the state database, so
  URLs outlive a restart and replicas agree) over the method, key, node,
  size, sha256 and expiry: a node cannot change any of them, reuse a URL
  after it expires, or write outside the store (`check_key` refuses `..`,
  absolute paths and every character outside [A-Za-z0-9_.-/]). `receive`
  streams the body to a temp file, refuses more bytes than the URL allows or
  a different sha256, and renames it into place only when both match.
- `S3ObjectStore`: any S3-compatible store (boto3, SigV4). Presigned PUT URLs
  carry the content length and the base64 sha256 (`x-amz-checksum-sha256`),
  which AWS S3 enforces; not every S3-compatible server does (moto does
  not), so at submit the orchestrator reads the object back and checks its
  size and sha256 itself (`verify`), whichever the store.

A URL stays valid until it expires, so a node could overwrite its object
after submitting it: the validator and the trainer hash what they download
and refuse bytes other than the submitted sha256 (the validator's verdict
then rejects the file and the node is ejected).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import re
import uuid
from pathlib import Path
from typing import Protocol
from urllib.parse import quote, urlencode

from swarmrl.protocol.digits import ascii_int

_KEY = re.compile(r"^[A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+)*$")


def check_key(key: str) -> str:
    """`key` if it names an object inside the store, else ValueError: slash-separated
    names of [A-Za-z0-9_.-], no empty part, no '.' or '..' part."""
    if not _KEY.match(key) or any(part in (".", "..") for part in key.split("/")):
        raise ValueError(f"invalid store key {key!r}")
    return key


class ObjectError(ValueError):
    """An upload or download the store refuses; `status` is the HTTP answer."""

    def __init__(self, status: int, detail: str):
        super().__init__(detail)
        self.status = status
        self.detail = detail


class ObjectStore(Protocol):
    def upload_url(self, key: str, node: str, size: int, sha256: str, expires: int) -> str: ...
    def upload_headers(self, sha256: str) -> dict[str, str]: ...
    def download_url(self, key: str, expires: int) -> str: ...
    def verify(self, key: str, size: int, sha256: str) -> str | None: ...
    def delete(self, key: str) -> None: ...
    def read(self, key: str, limit: int) -> bytes | None: ...


def _verify(data: bytes | None, size: int, sha256: str) -> str | None:
    """Why stored bytes are not the granted ones, or None when they are."""
    if data is None:
        return "the object has not been uploaded"
    if len(data) != size:
        return f"the object is {len(data)} bytes, the grant was for {size}"
    if hashlib.sha256(data).hexdigest() != sha256:
        return "the object does not hash to the granted sha256"
    return None


class LocalObjectStore:
    def __init__(self, root: Path, secret: bytes, base_url: str):
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.secret = secret
        self.base_url = base_url.rstrip("/")

    def _mac(self, *parts: object) -> bytes:
        msg = "\n".join(str(p) for p in parts).encode("utf-8", "replace")
        return hmac.new(self.secret, msg, hashlib.sha256).hexdigest().encode()

    def _path(self, key: str) -> Path:
        try:
            path = (self.root / check_key(key)).resolve()
        except ValueError as e:
            raise ObjectError(400, str(e)) from None
        if not path.is_relative_to(self.root.resolve()):
            raise ObjectError(400, f"key {key!r} leaves the store")
        return path

    def upload_url(self, key: str, node: str, size: int, sha256: str, expires: int) -> str:
        query = {"node": node, "size": size, "sha256": sha256, "expires": expires}
        query["sig"] = self._mac("PUT", key, node, size, sha256, expires).decode()
        return f"{self.base_url}/objects/{quote(key)}?{urlencode(query)}"

    def download_url(self, key: str, expires: int) -> str:
        query = {"expires": expires, "sig": self._mac("GET", key, expires).decode()}
        return f"{self.base_url}/objects/{quote(key)}?{urlencode(query)}"

    def check_download(self, key: str, expires: str, sig: str, now: float) -> Path:
        when = ascii_int(expires)
        if when is None or when < now:
            raise ObjectError(403, "download URL expired")
        if not hmac.compare_digest(self._mac("GET", key, when), _ascii(sig)):
            raise ObjectError(403, "bad URL signature")
        path = self._path(key)
        if not path.is_file():
            raise ObjectError(404, f"no object {key!r}")
        return path

    def check_upload(self, key: str, q: dict, length: str | None, now: float) -> tuple[int, str]:
        """The (size, sha256) a PUT may write, or ObjectError."""
        node, digest, sig = q.get("node"), q.get("sha256"), q.get("sig")
        size, expires = ascii_int(q.get("size")), ascii_int(q.get("expires"))
        if None in (node, digest, sig, size, expires):
            raise ObjectError(403, "the URL lacks its signed parameters")
        mac = self._mac("PUT", key, node, size, digest, expires)
        if not hmac.compare_digest(mac, _ascii(sig)):
            raise ObjectError(403, "bad URL signature")
        if expires < now:
            raise ObjectError(403, "upload URL expired")
        if length is None:
            raise ObjectError(411, "Content-Length is required")
        if ascii_int(length) != size:
            raise ObjectError(400, f"Content-Length {length} is not the granted size {size}")
        self._path(key)
        return size, digest

    async def receive(self, key: str, size: int, sha256: str, chunks) -> None:
        """Write the async iterator `chunks` as `key` if it is exactly `size` bytes
        hashing to `sha256`; otherwise nothing is stored."""
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.parent / f".{path.name}.{uuid.uuid4().hex}.tmp"
        h, n = hashlib.sha256(), 0
        try:
            with open(tmp, "wb") as f:
                async for chunk in chunks:
                    n += len(chunk)
                    if n > size:
                        raise ObjectError(413, f"body is longer than the granted {size} bytes")
                    h.update(chunk)
                    f.write(chunk)
                f.flush()
                os.fsync(f.fileno())
            if n != size:
                raise ObjectError(400, f"body is {n} bytes, the URL grants {size}")
            if h.hexdigest() != sha256:
                raise ObjectError(400, "body does not hash to the granted sha256")
            os.replace(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)

    def upload_headers(self, sha256: str) -> dict[str, str]:
        return {}

    def verify(self, key: str, size: int, sha256: str) -> str | None:
        path = self._path(key)
        try:
            if path.stat().st_size != size:  # refused before reading a large object
                return f"the object is {path.stat().st_size} bytes, the grant was for {size}"
            data = path.read_bytes()
        except FileNotFoundError:
            data = None
        return _verify(data, size, sha256)

    def size(self, key: str) -> int | None:
        try:
            return self._path(key).stat().st_size
        except FileNotFoundError:
            return None

    def delete(self, key: str) -> None:
        self._path(key).unlink(missing_ok=True)

    def read(self, key: str, limit: int) -> bytes | None:
        """The object's bytes (None when it is gone); one over `limit` bytes is refused."""
        try:
            with open(self._path(key), "rb") as f:
                data = f.read(limit + 1)
        except FileNotFoundError:
            return None
        if len(data) > limit:
            raise ObjectError(413, f"object over {limit} bytes")
        return data


class S3ObjectStore:
    def __init__(self, bucket: str, endpoint: str = "", region: str = "us-east-1"):
        import boto3
        from botocore.config import Config

        self.bucket = bucket
        self.s3 = boto3.client(
            "s3",
            endpoint_url=endpoint or None,
            region_name=region,
            config=Config(signature_version="s3v4"),
        )
        try:
            self.s3.head_bucket(Bucket=bucket)
        except self.s3.exceptions.ClientError:
            where = (
                {}
                if region == "us-east-1"
                else {"CreateBucketConfiguration": {"LocationConstraint": region}}
            )
            self.s3.create_bucket(Bucket=bucket, **where)

    def upload_url(self, key: str, node: str, size: int, sha256: str, expires: int) -> str:
        import time

        check_key(key)
        b64 = base64.b64encode(bytes.fromhex(sha256)).decode()
        return self.s3.generate_presigned_url(
            "put_object",
            Params={
                "Bucket": self.bucket,
                "Key": key,
                "ContentLength": size,
                "ChecksumSHA256": b64,
            },
            ExpiresIn=max(1, int(expires - time.time())),
        )

    def download_url(self, key: str, expires: int) -> str:
        import time

        return self.s3.generate_presigned_url(
            "get_object",
            Params={"Bucket": self.bucket, "Key": check_key(key)},
            ExpiresIn=max(1, int(expires - time.time())),
        )

    def upload_headers(self, sha256: str) -> dict[str, str]:
        return {"x-amz-checksum-sha256": base64.b64encode(bytes.fromhex(sha256)).decode()}

    def verify(self, key: str, size: int, sha256: str) -> str | None:
        """Reads the object back: a store that does not enforce the signed length and
        checksum headers (some S3-compatible ones do not) still cannot pass other bytes."""
        try:
            head = self.s3.head_object(Bucket=self.bucket, Key=check_key(key))
            if int(head["ContentLength"]) != size:
                return f"the object is {head['ContentLength']} bytes, the grant was for {size}"
            data = self.s3.get_object(Bucket=self.bucket, Key=key)["Body"].read()
        except self.s3.exceptions.ClientError:
            data = None
        return _verify(data, size, sha256)

    def delete(self, key: str) -> None:
        self.s3.delete_object(Bucket=self.bucket, Key=key)

    def read(self, key: str, limit: int) -> bytes | None:
        try:
            head = self.s3.head_object(Bucket=self.bucket, Key=check_key(key))
            if int(head["ContentLength"]) > limit:
                raise ObjectError(413, f"object over {limit} bytes")
            return self.s3.get_object(Bucket=self.bucket, Key=key)["Body"].read(limit + 1)
        except self.s3.exceptions.ClientError:
            return None


def _ascii(sig: str) -> bytes:
    """A signature from a URL as bytes to compare in constant time (hmac.compare_digest
    refuses str with characters outside ASCII)."""
    return sig.encode("ascii", "replace")
