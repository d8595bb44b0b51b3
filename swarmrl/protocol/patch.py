"""Weight patches: version n as the bytes that changed since a base version.

A patch turns the files of a base version into the files of a newer one,
losslessly. Each file of the new version is one of:

- `same`: byte for byte the base's file of that name (nothing stored);
- `xor`: the base has a file of that name and size; stored is the zstd
  frame of new XOR base. Consecutive RL versions published in bfloat16
  differ in about 1% of their elements, and a changed element usually
  differs in its low mantissa bits only, so the XOR is mostly zero bytes
  and what is not zero is small: zstd compresses both well;
- `sparse`: the base has a file of that name and size (an even number of
  bytes); stored is the zstd frame of the changed 16-bit words, window by
  window (`WINDOW` bytes of the file each): u32 count, then each changed
  word's position as the gap from the previous one (u32), then the words of
  new XOR base (u16), all little-endian, each array stored plane by plane
  (every element's first byte, then every second byte, ...: the high bytes of
  small gaps are runs of zeros). Where few elements changed (a low
  learning rate) this is smaller than the XOR, and where many did, larger;
- `new`: anything else (no such file in the base, another size); stored is
  the zstd frame of the new file.

Each file that could be either is built both ways and the smaller is kept.
Measured on consecutive versions of a real run (bench/weight_patches.py,
docs/results.md): before the choice existed, XOR + zstd was 13% smaller at
7% of elements changed, the positions and values 14% smaller at 1.7%.

Layout of a patch file:

    b"SWRLPATCH1\\n"  | u32 little-endian header length | header (JSON)
    | the stored frames, in the header's order

    header = {"base_version": int, "version": int,
              "files": [{"name", "op", "size", "length"}, ...]}

`size` is the new file's size, `length` the stored frame's. The header only
says how to rebuild the files; what they must be is said by the version's
signed manifest (protocol/manifest.py: each `PatchEntry` names the base
version and the whole-file sha256 of every base file, and `files` the
result's). `apply_patch` refuses a patch whose header disagrees with the
manifest, a base whose files are not the ones named, and a result whose
size or sha256 is not the manifest's, before anything is installed.

Memory: files are built and applied in 8 MB windows (numpy XOR, zstd
streams), so neither side holds a whole checkpoint in memory.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

MAGIC = b"SWRLPATCH1\n"
MAX_HEADER_BYTES = 1 << 20
WINDOW = 8 << 20
LEVEL = 1  # zstd level, measured (bench/weight_patches.py): 3 was no smaller, 9 12% smaller at 4x the time


class PatchError(ValueError):
    """A patch that cannot produce the version it claims (corrupt, wrong base, forged)."""


@dataclass(frozen=True)
class PatchedFile:
    name: str
    op: str  # same | xor | sparse | new
    size: int
    length: int


@dataclass
class PatchStats:
    """What building a patch saw: 16-bit words (bfloat16 elements) that differ from the
    base, out of the words compared (files of the base's size), and the bytes each
    encoding of those files came to (the patch keeps the smaller of each file's)."""

    changed_words: int = 0
    words: int = 0
    xor_bytes: int = 0
    sparse_bytes: int = 0


def _zstd():
    import zstandard  # imported here: only processes that build or apply patches need it

    return zstandard


def _diff_frames(base: Path, new: Path, xor_out, sparse_out, level: int,
                 stats: PatchStats) -> tuple[int, int]:  # fmt: skip
    """Write the zstd frame of new XOR base (same size) to `xor_out` and, with
    `sparse_out` (an even size), the changed words' frame to it; answer their lengths."""
    z = _zstd()
    starts = xor_out.tell(), sparse_out.tell() if sparse_out else 0
    xw = z.ZstdCompressor(level=level).stream_writer(xor_out, closefd=False)
    sw = (
        z.ZstdCompressor(level=level).stream_writer(sparse_out, closefd=False)
        if sparse_out
        else None
    )
    with open(base, "rb") as fb, open(new, "rb") as fn:
        while True:
            b, n = fb.read(WINDOW), fn.read(WINDOW)
            if not n:
                break
            x = np.bitwise_xor(np.frombuffer(b, np.uint8), np.frombuffer(n, np.uint8))
            words = x[: x.size & ~1].view(np.uint16)
            changed = np.flatnonzero(words)
            stats.changed_words += changed.size
            stats.words += words.size
            xw.write(x.tobytes())
            if sw is not None:
                gaps = np.diff(changed, prepend=-1).astype("<u4")
                sw.write(struct.pack("<I", changed.size) + _planes(gaps))
                sw.write(_planes(words[changed].astype("<u2")))
    lengths = []
    for writer, out, start in ((xw, xor_out, starts[0]), (sw, sparse_out, starts[1])):
        if writer is None:
            lengths.append(-1)
            continue
        writer.flush(z.FLUSH_FRAME)
        writer.close()
        lengths.append(out.tell() - start)
    stats.xor_bytes += lengths[0]
    stats.sparse_bytes += lengths[1] if sw is not None else lengths[0]
    return lengths[0], lengths[1]


def _planes(a: np.ndarray) -> bytes:
    """The bytes of `a` plane by plane: every element's first byte, then every second
    byte, ... (small numbers leave whole planes of zeros, which zstd all but drops)."""
    return a.view(np.uint8).reshape(-1, a.itemsize).T.tobytes()


def _unplanes(data: bytes, dtype: str) -> np.ndarray:
    size = np.dtype(dtype).itemsize
    planes = np.frombuffer(data, np.uint8).reshape(size, -1)
    return np.ascontiguousarray(planes.T).view(dtype).reshape(-1)


def _append(dst, path: Path) -> None:
    with open(path, "rb") as src:
        while chunk := src.read(WINDOW):
            dst.write(chunk)


def _whole_frame(new: Path, out, level: int) -> int:
    z = _zstd()
    start = out.tell()
    with open(new, "rb") as fn:
        z.ZstdCompressor(level=level).copy_stream(fn, out, read_size=WINDOW)
    return out.tell() - start


def build_patch(
    base_dir: Path,
    base_version: int,
    base_sha: dict[str, str],
    new_dir: Path,
    version: int,
    new_files: list[tuple[str, int, str]],
    out: Path,
    level: int = LEVEL,
) -> PatchStats:
    """Write the patch from the base version in `base_dir` (whole-file sha256 by name in
    `base_sha`) to the files `new_files` ((name, size, sha256)) of `new_dir` into `out`."""
    entries: list[PatchedFile] = []
    stats = PatchStats()
    body = out.with_name(out.name + ".body")
    drafts = [out.with_name(out.name + ".xor"), out.with_name(out.name + ".sparse")]
    try:
        with open(body, "wb") as f:
            for name, size, sha in new_files:
                base = base_dir / name
                if base_sha.get(name) == sha:
                    entries.append(PatchedFile(name, "same", size, 0))
                elif name in base_sha and base.stat().st_size == size:
                    with open(drafts[0], "wb") as xf, open(drafts[1], "wb") as sf:
                        lengths = _diff_frames(base, new_dir / name, xf, sf if size % 2 == 0 else None, level, stats)  # fmt: skip
                    pick = 1 if 0 <= lengths[1] < lengths[0] else 0
                    _append(f, drafts[pick])
                    entries.append(PatchedFile(name, ("xor", "sparse")[pick], size, lengths[pick]))
                else:
                    entries.append(PatchedFile(name, "new", size, _whole_frame(new_dir / name, f, level)))  # fmt: skip
        header = json.dumps(
            {
                "base_version": base_version,
                "version": version,
                "files": [e.__dict__ for e in entries],
            },
            sort_keys=True,
            separators=(",", ":"),
        ).encode()
        with open(out, "wb") as f, open(body, "rb") as b:
            f.write(MAGIC + struct.pack("<I", len(header)) + header)
            while chunk := b.read(WINDOW):
                f.write(chunk)
    finally:
        for p in (body, *drafts):
            p.unlink(missing_ok=True)
    return stats


def read_header(f, size: int) -> tuple[dict, int]:
    """The header of the patch file open as `f` (`size` bytes), and where its frames start."""
    head = f.read(len(MAGIC) + 4)
    if len(head) < len(MAGIC) + 4 or head[: len(MAGIC)] != MAGIC:
        raise PatchError("not a swarmrl patch (bad magic)")
    (n,) = struct.unpack("<I", head[len(MAGIC) :])
    if n > MAX_HEADER_BYTES or len(head) + n > size:
        raise PatchError(f"patch header of {n} bytes does not fit")
    try:
        header = json.loads(f.read(n))
        files = [PatchedFile(**e) for e in header["files"]]
        base_version, version = int(header["base_version"]), int(header["version"])
    except (ValueError, TypeError, KeyError) as e:
        raise PatchError(f"malformed patch header: {e}") from None
    header = {"base_version": base_version, "version": version, "files": files}
    return header, len(head) + n


def apply_patch(
    patch: Path,
    base_dir: Path,
    base_version: int,
    base_sha: dict[str, str],
    version: int,
    expect: list[tuple[str, int, str]],
    out_dir: Path,
) -> None:
    """Rebuild the files `expect` ((name, size, sha256), from the signed manifest) of
    `version` in `out_dir` from the base version in `base_dir` and the patch file; raise
    PatchError unless every base file is the one the manifest names and every result
    has the manifest's size and sha256. On failure no rebuilt file is left."""
    z = _zstd()
    total = patch.stat().st_size
    with open(patch, "rb") as f:
        header, pos = read_header(f, total)
        if (header["base_version"], header["version"]) != (base_version, version):
            raise PatchError(
                f"patch is from {header['base_version']} to {header['version']},"
                f" expected {base_version} to {version}"
            )
        files = header["files"]
        if [(e.name, e.size) for e in files] != [(n, s) for n, s, _ in expect]:
            raise PatchError("patch files differ from the manifest's")
        if pos + sum(e.length for e in files) != total:
            raise PatchError("patch frames do not add up to the patch file's size")
        written: list[Path] = []
        try:
            for e, (name, _size, sha) in zip(files, expect, strict=True):
                written.append(out_dir / name)
                try:
                    got = _apply_one(z, f, e, base_dir / name, base_sha.get(name), written[-1])
                except z.ZstdError as err:
                    raise PatchError(f"{name}: corrupt frame: {err}") from None
                if got != sha:
                    raise PatchError(f"{name}: rebuilt file does not match the manifest's sha256")
        except BaseException:  # nothing half-rebuilt is left where a loader could find it
            for p in written:
                p.unlink(missing_ok=True)
            raise


def _apply_one(z, f, e: PatchedFile, base: Path, base_sha: str | None, target: Path) -> str:
    if e.op not in ("same", "xor", "sparse", "new") or e.length < 0 or e.size < 0:
        raise PatchError(f"{e.name}: unknown operation {e.op!r}")
    if e.op != "new":
        if base_sha is None or not base.is_file() or (e.op == "same" and e.length):
            raise PatchError(f"{e.name}: the base version has no such file")
        if e.op in ("xor", "sparse") and base.stat().st_size != e.size:
            raise PatchError(f"{e.name}: base file has another size")
        if e.op == "sparse" and e.size % 2:
            raise PatchError(f"{e.name}: a sparse patch of an odd size")
    whole = hashlib.sha256()
    based = hashlib.sha256()
    frame = _Slice(f, e.length)
    with open(target, "wb") as out:
        if e.op == "same":
            with open(base, "rb") as fb:
                while chunk := fb.read(WINDOW):
                    based.update(chunk)
                    whole.update(chunk)
                    out.write(chunk)
        elif e.op == "sparse":
            reader = z.ZstdDecompressor().stream_reader(frame, read_across_frames=False)
            with open(base, "rb") as fb:
                _apply_sparse(e, reader, fb, out, based, whole)
        else:
            reader = z.ZstdDecompressor().stream_reader(frame, read_across_frames=False)
            fb = open(base, "rb") if e.op == "xor" else None
            try:
                done = 0
                while done < e.size:
                    data = reader.read(min(WINDOW, e.size - done))
                    if not data:
                        raise PatchError(f"{e.name}: frame ends at {done} of {e.size} bytes")
                    if fb is not None:
                        b = fb.read(len(data))
                        based.update(b)
                        data = np.bitwise_xor(
                            np.frombuffer(b, np.uint8), np.frombuffer(data, np.uint8)
                        ).tobytes()
                    whole.update(data)
                    out.write(data)
                    done += len(data)
                if reader.read(1):
                    raise PatchError(f"{e.name}: frame holds more than {e.size} bytes")
            finally:
                if fb is not None:
                    fb.close()
        out.flush()
        os.fsync(out.fileno())
    frame.skip_rest()
    if e.op != "new" and based.hexdigest() != base_sha:
        raise PatchError(f"{e.name}: the base file is not the one the manifest names")
    return whole.hexdigest()


def _exactly(reader, n: int, name: str) -> bytes:
    data = b""
    while len(data) < n:
        more = reader.read(n - len(data))
        if not more:
            raise PatchError(f"{name}: sparse frame ends early")
        data += more
    return data


def _apply_sparse(e: PatchedFile, reader, fb, out, based, whole) -> None:
    """Rebuild a `sparse` file window by window: each window's changed words, XORed
    into the base's words at their positions."""
    done = 0
    while done < e.size:
        b = fb.read(min(WINDOW, e.size - done))
        based.update(b)
        (count,) = struct.unpack("<I", _exactly(reader, 4, e.name))
        words = np.frombuffer(b, "<u2").copy()
        if count > words.size:
            raise PatchError(f"{e.name}: {count} changed words in a window of {words.size}")
        gaps = _unplanes(_exactly(reader, 4 * count, e.name), "<u4").astype(np.int64)
        values = _unplanes(_exactly(reader, 2 * count, e.name), "<u2")
        at = np.cumsum(gaps) - 1
        if count and (gaps.min() < 1 or at[-1] >= words.size):
            raise PatchError(f"{e.name}: changed-word positions out of order or range")
        words[at] ^= values
        data = words.tobytes()
        whole.update(data)
        out.write(data)
        done += len(b)
    if reader.read(1):
        raise PatchError(f"{e.name}: frame holds more than {e.size} bytes")


class _Slice:
    """`length` bytes of `f` from where it stands, as a readable stream."""

    def __init__(self, f, length: int):
        self.f, self.left = f, length

    def read(self, n: int = -1) -> bytes:
        n = self.left if n is None or n < 0 else min(n, self.left)
        data = self.f.read(n)
        self.left -= len(data)
        return data

    def skip_rest(self) -> None:
        self.f.seek(self.left, os.SEEK_CUR)
        self.left = 0
