"""Asynchronous checkpoints of a DiLoCo site: to memory at once, to disk in the background.

`save()` runs on the training thread: it serializes the state to a file in
/dev/shm (a memory write) and returns; a background thread copies that file
to `<run>/checkpoints/site<K>/outer-<step>.pt` through a temporary name,
fsyncs it and renames it, so a file with the final name is complete. If the
previous copy is still running when the next checkpoint is due, that
checkpoint is skipped rather than waited for. `latest()` is the newest complete
file; older ones beyond `keep` are deleted once a newer one is complete.
Where /dev/shm does not exist the memory stage is the system's temporary
directory.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import tempfile
import threading
from pathlib import Path

import torch

log = logging.getLogger("swarmrl.diloco")
NAME = re.compile(r"^outer-(\d+)\.pt$")


def _memory_dir() -> Path:
    shm = Path("/dev/shm")
    return shm if shm.is_dir() and os.access(shm, os.W_OK) else Path(tempfile.gettempdir())


def complete_checkpoints(directory: Path) -> list[tuple[int, Path]]:
    found = []
    for p in directory.glob("outer-*.pt") if directory.is_dir() else []:
        m = NAME.match(p.name)
        if m:
            found.append((int(m.group(1)), p))
    return sorted(found)


class AsyncCheckpointer:
    def __init__(self, directory: Path, keep: int = 2):
        self.directory = directory
        self.keep = keep
        self.directory.mkdir(parents=True, exist_ok=True)
        self._thread: threading.Thread | None = None
        self.error: BaseException | None = None
        self.skipped = 0

    def latest(self) -> tuple[int, Path] | None:
        found = complete_checkpoints(self.directory)
        return found[-1] if found else None

    def busy(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def save(self, step: int, state: dict) -> bool:
        """Stage `state` in memory and start its copy to disk; False if skipped."""
        if self.busy():
            self.skipped += 1
            log.warning(
                "checkpoint of outer step %d skipped: the previous copy is still running", step
            )
            return False
        fd, staged = tempfile.mkstemp(prefix="swarmrl-diloco-", suffix=".pt", dir=_memory_dir())
        with os.fdopen(fd, "wb") as f:
            torch.save(state, f)
        self._thread = threading.Thread(
            target=self._copy, args=(Path(staged), step), name="checkpoint-copy", daemon=True
        )
        self._thread.start()
        return True

    def _copy(self, staged: Path, step: int) -> None:
        final = self.directory / f"outer-{step}.pt"
        tmp = final.with_name(final.name + ".tmp")
        try:
            with staged.open("rb") as src, tmp.open("wb") as dst:
                shutil.copyfileobj(src, dst, 1 << 20)
                dst.flush()
                os.fsync(dst.fileno())
            os.replace(tmp, final)
            for _, old in complete_checkpoints(self.directory)[: -self.keep]:
                old.unlink(missing_ok=True)
            log.info("checkpoint of outer step %d on disk: %s", step, final)
        except BaseException as e:  # reported by wait(); training goes on without this copy
            self.error = e
            log.error("checkpoint of outer step %d failed: %s", step, e)
        finally:
            staged.unlink(missing_ok=True)

    def wait(self) -> None:
        """Block until the copy in flight is on disk (at the end of a run)."""
        if self._thread is not None:
            self._thread.join()
