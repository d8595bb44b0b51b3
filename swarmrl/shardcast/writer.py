"""Writing a shard to its place in the file: through the page cache, or around it.

With `direct=True` the aligned middle of each shard is written with O_DIRECT
from a page-aligned staging buffer, and only the unaligned head and tail
(less than a block each, shared with the neighbouring shards) go through the
page cache. Why: on the VMs we measured, copying into new page-cache memory
costs about 2.5 s of CPU per GiB (the host backs freed guest memory lazily),
while an O_DIRECT write of the same GiB costs 0.04 s of CPU and 0.45 s of
wall time. A client that downloads a checkpoint mostly to keep it (relays do
not: they serve from the page cache, so they write through it) spends most of
its CPU there otherwise. When the filesystem refuses O_DIRECT (tmpfs, some
network filesystems) the file is written through the page cache.

Bytes must be given in order from the start of the shard (a Range resume
continues where the last write ended), which is how the client receives them.
After any error the writer is unusable: the client gives up the version (a
local disk problem, not the server's) and starts it again later.
"""

from __future__ import annotations

import mmap
import os

ALIGN = 4096  # covers 512-byte and 4 KiB logical blocks
STAGE = 4 << 20


def pwrite_all(fd: int, data, offset: int) -> None:
    """pwrite that fails loudly instead of writing part of `data`."""
    view = memoryview(data)
    while view:
        n = os.pwrite(fd, view, offset)
        if n <= 0:
            raise OSError(f"pwrite wrote {n} bytes")
        view, offset = view[n:], offset + n


def open_direct(path) -> int | None:
    """An O_DIRECT write descriptor for `path`, or None where that is not possible."""
    flag = getattr(os, "O_DIRECT", 0)
    if not flag:
        return None
    try:
        return os.open(path, os.O_WRONLY | flag)
    except OSError:  # EINVAL: the filesystem does not do direct I/O
        return None


class ShardWriter:
    def __init__(self, fd: int, direct_fd: int | None, offset: int, size: int):
        self.fd, self.direct_fd = fd, direct_fd
        self.offset, self.size = offset, size
        self.written = 0  # bytes of the shard handed to write()
        if direct_fd is not None:
            # bytes before the first block boundary inside the shard go buffered
            self.head = min(size, -offset % ALIGN)
            self.stage = mmap.mmap(-1, STAGE)  # page-aligned, as O_DIRECT needs
            self.view = memoryview(self.stage)
            self.stage_at = offset + self.head  # file offset of stage[0], block-aligned
            self.fill = 0

    def write(self, chunk) -> None:
        if self.direct_fd is None:
            pwrite_all(self.fd, chunk, self.offset + self.written)
            self.written += len(chunk)
            return
        chunk = memoryview(chunk)
        if self.written < self.head:
            n = min(len(chunk), self.head - self.written)
            pwrite_all(self.fd, chunk[:n], self.offset + self.written)
            self.written += n
            chunk = chunk[n:]
        while chunk:
            n = min(len(chunk), STAGE - self.fill)
            self.view[self.fill : self.fill + n] = chunk[:n]
            self.fill += n
            self.written += n
            chunk = chunk[n:]
            if self.fill == STAGE:
                self._flush_direct(STAGE)
        if self.written == self.size:
            self._flush_direct(self.fill - self.fill % ALIGN)
            if self.fill:  # the tail: less than a block, through the page cache
                pwrite_all(self.fd, self.view[: self.fill], self.stage_at)
                self.fill = 0

    def _flush_direct(self, n: int) -> None:
        if n == 0:
            return
        done = os.pwrite(self.direct_fd, self.view[:n], self.stage_at)
        if done != n:
            raise OSError(f"short direct write: {done} of {n} bytes")
        self.view[: self.fill - n] = self.view[n : self.fill]
        self.fill -= n
        self.stage_at += n

    def close(self) -> None:
        if self.direct_fd is not None:
            self.view.release()
            self.stage.close()
