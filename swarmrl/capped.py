"""Untrusted bytes decoded in a child process whose memory the kernel caps.

Why a child: a parquet file declares in its own headers how much its decoder will
allocate (a page's uncompressed size, a run of repeated values, a dictionary index
used once per row), and a footer can lie about all of it, so no count taken before
decoding can be trusted to bound what decoding costs. The kernel's limit on a
process's address space (RLIMIT_AS) holds whatever the file says: an allocation
past it fails, pyarrow raises `ArrowMemoryError`, and the file is refused. That
limit is process-wide, so it cannot be set around one call inside a trainer or an
orchestrator; it is set in a child.

How: one child per process (`python -m swarmrl.capped`), started at first use and
kept. Each request names a function by `module:name`, which the child imports and
calls as `function(data, params)`; it returns the answer's bytes (any object with
the buffer protocol) or raises `ValueError` with the reason the input is refused.
Before each call the child sets its soft RLIMIT_AS to its current size plus the
request's `memory_bytes` (at most its hard limit), so the cap is the same whatever
earlier requests left behind, and restores the soft limit to the hard one after.
Arrow allocates from the system allocator there, with a fixed mmap threshold and
one malloc arena, so that freed buffers leave the address space and the count
stays close to what is in use.

Who is to blame. A refusal (`CappedRefusal`) is the function's own reason: the
`ValueError` it raised, which names what the input holds. Everything else says
nothing provable about the input and is a `CappedFailure`: an allocation over the
cap (the function checks the sizes the input declares before it allocates, and
refuses those itself), another exception (a fault in our decoding or in pyarrow),
`timeout_s` passed (the child is killed), or the child died. A caller must not
blame the sender for a failure (the validator calls such a file `unverifiable`,
the trainer leaves it for later), and it counts against the sender's standing
instead, so that failures are no free work for an attacker. When the child had
served earlier requests, a failure other than a timeout is tried once more in a
fresh child within what is left of the same deadline, so that no answer depends
on what an earlier request did; one call never takes much longer than
`timeout_s` in all. Each answer carries the child's peak resident memory during
the call (`Capped.last_peak_bytes`), which the tests and benchmarks compare with
the cap.

What is not the input's fault at all, a target that cannot be imported or a cap
that cannot be set (not Linux: the cap is RLIMIT_AS and the sizes are read from
/proc), raises `CappedUnavailable`, a kind of failure. Nothing is decoded then,
so it fails closed. The child runs trusted code (ours and pyarrow's) on untrusted
bytes; it is not a sandbox against code execution.
"""

from __future__ import annotations

import atexit
import importlib
import json
import os
import select
import signal
import struct
import subprocess
import sys
import threading
import time

REQUEST = struct.Struct(">QQ")  # header length, data length
ANSWER = struct.Struct(">cQQQ")  # status, payload length, resident bytes before, peak during
OK, REFUSED, MEMORY, ERROR, UNAVAILABLE = b"o", b"r", b"m", b"e", b"u"
DIED, TIMEOUT = b"d", b"t"  # the parent's own: no answer came
CHILD_ENV = {
    "ARROW_DEFAULT_MEMORY_POOL": "system",
    "MALLOC_ARENA_MAX": "1",
    "MALLOC_MMAP_THRESHOLD_": "131072",  # fixed: big buffers are mmapped, and unmapped on free
    "OMP_NUM_THREADS": "1",
}
MAX_HEADER_BYTES = 1 << 20


class CappedRefusal(ValueError):
    """Input the capped function refused, for the reason it gave: the input's fault."""


class CappedFailure(RuntimeError):
    """No answer, and no proof that the input is at fault: over the cap, an internal
    error, the deadline, or the child's death."""


class CappedUnavailable(CappedFailure):
    """The capped child cannot run the request at all (no cap on this system, or the
    target does not import): this machine's fault, not the input's."""


class Capped:
    """The parent's side: one child, one request at a time (a lock)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._child: subprocess.Popen | None = None
        self.last_peak_bytes = 0  # the child's resident growth during the last request

    def call(
        self, target: str, data: bytes, params: dict, memory_bytes: int, timeout_s: float
    ) -> bytes:
        """`target(data, params)` in the child under `memory_bytes` of address space, by
        `timeout_s`: its answer, CappedRefusal with the function's reason, or
        CappedFailure (CappedUnavailable) when there is no answer to blame on the input."""
        header = json.dumps({"target": target, "params": params, "memory": memory_bytes})
        deadline = time.monotonic() + timeout_s
        with self._lock:
            try:
                fresh = self._child is None or self._child.poll() is not None
                status, payload = self._once(header.encode(), data, memory_bytes, deadline)
                left = deadline - time.monotonic()
                if status in (MEMORY, ERROR, DIED) and not fresh and left > 0:
                    # not the function's own reason: the same request again in a fresh
                    # child, within the same deadline (a timeout is not tried again)
                    self._stop()
                    status, payload = self._once(header.encode(), data, memory_bytes, deadline)
                if status in (MEMORY, ERROR, UNAVAILABLE, DIED, TIMEOUT):
                    self._stop()  # a child that hit its cap or failed is not reused
            except BaseException:
                self._stop()  # interrupted mid-request: the pipe's framing is lost
                raise
        if status == OK:
            return payload
        if status == TIMEOUT:
            payload = f"decoding took longer than {timeout_s:.0f} s".encode()
        reason = payload.decode("utf-8", "replace")
        if status == UNAVAILABLE:
            raise CappedUnavailable(reason)
        if status == REFUSED:
            raise CappedRefusal(reason)
        raise CappedFailure(reason)

    def _once(
        self, header: bytes, data: bytes, memory_bytes: int, deadline: float
    ) -> tuple[bytes, bytes]:
        """One request by `deadline` (time.monotonic): (status, payload); status DIED
        or TIMEOUT, with the reason, when the child gave no answer."""
        child = self._start()
        # written from a thread, so that a child that stops reading cannot hold the
        # caller past its deadline: killing the child ends the write
        writer = threading.Thread(
            target=_write, args=(child.stdin, REQUEST.pack(len(header), len(data)), header, data)
        )
        writer.start()
        try:
            head = _read(child.stdout, ANSWER.size, deadline)
            status, size, before, peak = ANSWER.unpack(head)
            if size > memory_bytes + MAX_HEADER_BYTES:
                self._stop()
                return DIED, b"the decoder answered more than its cap"
            payload = _read(child.stdout, size, deadline)
        except TimeoutError:
            self._stop()
            return TIMEOUT, b"decoding ran past its deadline"
        except (OSError, EOFError, struct.error):
            code = self._stop()
            return DIED, f"the decoder died ({_exit_text(code)})".encode()
        finally:
            writer.join()
        self.last_peak_bytes = max(0, peak - before)
        if status == MEMORY:
            return MEMORY, (
                f"decoding needs more than its {memory_bytes / (1 << 20):.0f} MiB of memory"
            ).encode()
        return status, payload

    def _start(self) -> subprocess.Popen:
        if self._child is None or self._child.poll() is not None:
            self._child = subprocess.Popen(
                [sys.executable, "-m", "swarmrl.capped"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                env={**os.environ, **CHILD_ENV},
                bufsize=0,
            )
        return self._child

    def _stop(self) -> int | None:
        child, self._child = self._child, None
        if child is None:
            return None
        if child.poll() is None:
            child.kill()
        code = child.wait()
        for pipe in (child.stdin, child.stdout):
            try:
                pipe.close()
            except OSError:
                pass  # a pipe to a dead child may refuse its last flush
        return code

    def close(self) -> None:
        with self._lock:
            self._stop()


def _write(stream, *parts: bytes) -> None:
    try:
        for part in parts:
            stream.write(part)
        stream.flush()
    except (OSError, ValueError):
        pass  # the child died or was stopped: the reader says which


def _read(stream, n: int, deadline: float) -> bytes:
    """Exactly `n` bytes from `stream` by `deadline` (TimeoutError), or EOFError."""
    out = bytearray()
    fd = stream.fileno()
    while len(out) < n:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            raise TimeoutError
        chunk = os.read(fd, min(n - len(out), 1 << 20))
        if not chunk:
            raise EOFError
        out += chunk
    return bytes(out)


def _exit_text(code: int | None) -> str:
    if code is None:
        return "no exit status"
    return f"signal {-code}" if code < 0 else f"exit status {code}"


_shared: Capped | None = None
_shared_lock = threading.Lock()


def shared() -> Capped:
    """This process's child (started at its first request, stopped at exit)."""
    global _shared
    with _shared_lock:
        if _shared is None:
            _shared = Capped()
            atexit.register(_shared.close)
        return _shared


# The child's side.


def _address_space() -> int:
    return int(open("/proc/self/statm").read().split()[0]) * os.sysconf("SC_PAGE_SIZE")


def _resident() -> tuple[int, int]:
    """(resident now, peak resident) of this process, in bytes."""
    now = peak = 0
    try:
        lines = open("/proc/self/status").readlines()
    except OSError:
        return 0, 0  # no /proc: no figures (and no cap: requests are unavailable)
    for line in lines:
        if line.startswith("VmRSS:"):
            now = int(line.split()[1]) * 1024
        elif line.startswith("VmHWM:"):
            peak = int(line.split()[1]) * 1024
    return now, peak


def _reset_peak() -> None:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # resets VmHWM to the resident size now
    except OSError:
        pass  # an older kernel: the peak is then the child's lifetime peak


class _Unavailable(Exception):
    """The child could not import the target or set its cap."""


def _serve(stdin, stdout) -> None:
    import pyarrow as pa

    try:
        import resource  # not on Windows: every request is then unavailable

        _, hard = resource.getrlimit(resource.RLIMIT_AS)
    except ImportError:
        resource = hard = None
    pa.set_cpu_count(1)
    pa.set_io_thread_count(1)
    while True:
        head = stdin.read(REQUEST.size)
        if len(head) < REQUEST.size:
            return  # the parent closed the pipe
        n_header, n_data = REQUEST.unpack(head)
        header = json.loads(stdin.read(n_header))
        data = stdin.read(n_data)
        before = peak = 0
        try:
            try:
                module, name = header["target"].split(":")
                fn = getattr(importlib.import_module(module), name)
                if resource is None:
                    raise OSError("no RLIMIT_AS on this system")
                _reset_peak()
                before, _ = _resident()
                cap = _address_space() + int(header["memory"])
                if hard != resource.RLIM_INFINITY:
                    cap = min(cap, hard)
                resource.setrlimit(resource.RLIMIT_AS, (cap, hard))
            except Exception as e:
                raise _Unavailable(f"no capped decoding here: {type(e).__name__}: {e}") from e
            try:
                status, payload = OK, fn(data, header["params"])
            finally:
                resource.setrlimit(resource.RLIMIT_AS, (hard, hard))
        except _Unavailable as e:
            status, payload = UNAVAILABLE, str(e).encode("utf-8", "replace")
        except MemoryError:
            status, payload = MEMORY, b""
        except ValueError as e:
            status, payload = REFUSED, str(e).encode("utf-8", "replace")
        except Exception as e:  # any other failure on untrusted input refuses it
            status, payload = ERROR, f"{type(e).__name__}: {e}".encode("utf-8", "replace")
        del data
        _, peak = _resident()
        view = memoryview(payload)
        stdout.write(ANSWER.pack(status, view.nbytes, before, peak))
        stdout.write(view)
        stdout.flush()
        del view, payload


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent ends it (Ctrl-C reaches both)
    _serve(sys.stdin.buffer, sys.stdout.buffer)
