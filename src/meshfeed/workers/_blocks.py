"""Where the rows between the loading process and its workers live: /dev/shm, or files.

Worker processes read their input rows from, and write their output rows into, blocks
of memory the loading process creates and names to them. The natural home is
``/dev/shm``, and it is small where many runs happen: Docker gives a container 64 MiB
unless told otherwise, and many Kubernetes pods the same. A tmpfs hands out pages only
when they are first written, so a block created in a /dev/shm too small for it is
created without complaint -- and the first write past the end of the space kills the
writer with ``SIGBUS`` (PyTorch's DataLoader and Grain die that way). So every block is
*reserved* when it is created (``posix_fallocate``: the pages exist from then on, and a
lack of space is ``ENOSPC`` at creation, never a signal at a later write, whoever fills
/dev/shm afterwards).

``Transport`` decides where a pool's blocks go. Before the first step goes to the
workers, ``plan`` compares what a step's blocks take with what /dev/shm has free
(``os.statvfs``; of it, half, leaving the rest to the machine's other processes, their
loaders and NCCL): when the read-ahead would not fit, it is cut to the steps that do;
when not even one step ahead fits, every block goes to a *file* instead -- a
memory-mapped file in a folder of the temporary directory on disk (``TMPDIR``), reserved
the same way. Files rather than pipes, because the workers and the pool then work
exactly as with /dev/shm (a block is mapped by name, rows are written in place, nothing
is copied or pickled on the way), and the page cache keeps the pages in memory all the
same. A block that cannot be created in /dev/shm later (another process filled it)
goes to a file too, and so does every block after it. Each change is said once on
stderr with the sizes and the remedies. Blocks are unlinked by the process that made
them (on close, on error, at exit, when garbage-collected); a /dev/shm block of a
process that is killed is unlinked by Python's resource tracker, and a files folder by
the workers, which see their parent gone, or by the next loader that starts files.
"""

from __future__ import annotations

import errno
import glob
import mmap
import os
import secrets
import shutil
import sys
import tempfile
from multiprocessing import resource_tracker, shared_memory
from typing import Any, Protocol

SHM = "/dev/shm"
FOLDER_PREFIX = "meshfeed-rows-"
SHM_SHARE = 0.5  # of /dev/shm's free space, what one pool plans to use
MiB = 1 << 20
REMEDIES = (
    "give the container more shared memory: docker run --shm-size=2g (or --ipc=host); "
    "on Kubernetes, mount an emptyDir with medium: Memory at /dev/shm"
)


class Block(Protocol):
    """A block of memory shared with the workers (a ``MappedBlock``, or a ``SharedMemory``
    where there is no /dev/shm folder)."""

    @property
    def name(self) -> str: ...

    @property
    def size(self) -> int: ...

    @property
    def buf(self) -> Any: ...

    def unlink(self) -> None: ...

    def close(self) -> None: ...


def _reserve(fd: int, size: int) -> None:
    """Gives the file its pages now (raises ``OSError(ENOSPC)`` if they do not fit)."""
    if hasattr(os, "posix_fallocate"):
        os.posix_fallocate(fd, 0, size)


def shm_block(size: int) -> Block:
    """A block in /dev/shm with its pages reserved (``OSError`` if they do not fit).

    Its name goes to Python's resource tracker before the block exists, so a process
    killed in between leaks nothing. Where /dev/shm is a folder (Linux) the block is a
    file there, mapped (``MappedBlock``); elsewhere a ``SharedMemory``.
    """
    if not os.path.isdir(SHM):
        return shared_memory.SharedMemory(create=True, size=max(1, size))
    while True:
        name = f"psm_mf_{secrets.token_hex(8)}"
        resource_tracker.register(f"/{name}", "shared_memory")
        try:
            fd = os.open(os.path.join(SHM, name), os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
            break
        except FileExistsError:
            continue
        except OSError:
            resource_tracker.unregister(f"/{name}", "shared_memory")
            raise
    try:
        return MappedBlock(fd, os.path.join(SHM, name), size, name=name, tracked=True)
    except OSError:
        resource_tracker.unregister(f"/{name}", "shared_memory")
        raise


class MappedBlock:
    """A block backed by a file, mapped: in /dev/shm (a tmpfs: shared memory), or in a
    folder on disk. Its name is what a worker maps it by: the /dev/shm name, or the
    file's path.

    Rows in it may be lent to arrays (``meshfeed.core._held.lend``), which hold the
    mapping: ``close`` while some are out leaves the mapping to them (it is unmapped
    when the last is gone) instead of unmapping memory an array still reads.
    """

    def __init__(
        self, fd: int, path: str, size: int, *, name: str | None = None, tracked: bool = False
    ) -> None:
        self.path = path
        self.name = name or path
        self.size = max(1, size)
        self._tracked = tracked
        try:
            os.ftruncate(fd, self.size)
            _reserve(fd, self.size)
            self._map: mmap.mmap | None = mmap.mmap(fd, self.size)
        except OSError:
            os.unlink(path)
            raise
        finally:
            os.close(fd)  # the mapping needs no descriptor: none is held per block
        self.buf: memoryview | None = memoryview(self._map)

    def unlink(self) -> None:
        """Removes the block's name (its memory stays while it is mapped)."""
        try:
            os.unlink(self.path)
        finally:
            if self._tracked:
                self._tracked = False
                resource_tracker.unregister(f"/{self.name}", "shared_memory")

    def close(self) -> None:
        """Unmaps the block, or leaves that to the arrays its rows are lent to."""
        if self.buf is None or self._map is None:
            return
        try:
            self.buf.release()  # BufferError while rows of it are lent
            self._map.close()
        except BufferError:
            pass  # the lent rows hold the map; it goes with the last of them
        self.buf = self._map = None


def file_block(folder: str, size: int) -> MappedBlock:
    """A block backed by a new file in ``folder``, its pages reserved."""
    fd, path = tempfile.mkstemp(dir=folder, prefix="block-")
    return MappedBlock(fd, path, size)


def attach(name: str) -> tuple[Any, Any]:
    """Maps an existing block by name (a /dev/shm name, or a file's path) without
    registering it for cleanup in this process; returns the map and its ``close``."""
    if os.sep not in name.lstrip("/"):
        try:  # Python 3.13+
            shm = shared_memory.SharedMemory(name=name, track=False)  # type: ignore[call-arg]
            return shm.buf, shm.close
        except TypeError:
            pass
        name = os.path.join(SHM, name.lstrip("/"))
    fd = os.open(name, os.O_RDWR)
    try:
        mapped = mmap.mmap(fd, 0)
    finally:
        os.close(fd)
    return mapped, mapped.close


def is_file_block(name: str) -> bool:
    """Whether a block's name is a file's path (the files transport)."""
    return os.sep in name.lstrip("/")


def remove_folder(folder: str) -> None:
    """Removes a files transport's folder (only one of ours, whatever the caller passes)."""
    if os.path.basename(folder).startswith(FOLDER_PREFIX):
        shutil.rmtree(folder, ignore_errors=True)


def shm_free() -> int | None:
    """Bytes /dev/shm has free now (``None`` where there is no /dev/shm)."""
    try:
        stat = os.statvfs(SHM)
    except OSError:
        return None
    return stat.f_bavail * stat.f_frsize


def _mib(size: float) -> str:
    return f"{size / MiB:.1f} MiB"


def _say(message: str) -> None:
    sys.stderr.write(f"meshfeed: {message}\n")
    sys.stderr.flush()


class Transport:
    """Where one pool's blocks go: /dev/shm while they fit, then files (said once)."""

    def __init__(self) -> None:
        self.folder: str | None = None  # the files' folder, once blocks go to files

    @property
    def kind(self) -> str:
        """``"shm"`` or ``"files"``."""
        return "shm" if self.folder is None else "files"

    def plan(self, step_bytes: int, wanted: int, lent: int = 0) -> tuple[int | None, int]:
        """The most steps the read-ahead may hold for blocks of ``step_bytes`` a step
        (``wanted`` is what it could hold otherwise; ``None``: no bound), and how many
        more slots may be out lent (of ``lent`` asked for: lending gives way first,
        down to two steps ahead); moves every block to files when not even one step
        ahead fits in /dev/shm."""
        free = shm_free()
        if free is None or self.folder is not None:
            return None, lent
        room = int(free * SHM_SHARE) // max(1, step_bytes) - 1  # the one collected aside
        if room >= wanted + lent:
            return None, lent
        if room < 1:
            self._to_files(
                f"/dev/shm has {_mib(free)} free, too little for two steps of rows in the "
                f"record workers' hands ({_mib(step_bytes)} each, kept within half of it)"
            )
            return None, lent
        spare = min(lent, max(0, room - min(wanted, 2)))
        ahead = room - spare
        if ahead >= wanted:
            return None, spare
        _say(
            f"/dev/shm has {_mib(free)} free, and a step of rows in the record workers' "
            f"hands takes {_mib(step_bytes)} there: the read-ahead is cut to {ahead} "
            f"step(s) (from up to {wanted}) to fit in half of it. To read further ahead, "
            f"{REMEDIES}."
        )
        return ahead, spare

    def create(self, size: int) -> Block:
        """A new block of ``size`` bytes, its pages reserved."""
        if self.folder is None:
            try:
                return shm_block(size)
            except OSError as error:
                self._to_files(
                    f"a block of {_mib(size)} could not be made in /dev/shm "
                    f"({os.strerror(error.errno or errno.ENOSPC)}; {_mib(shm_free() or 0)} "
                    "free: another process may have filled it)"
                )
        assert self.folder is not None
        try:
            return file_block(self.folder, size)
        except OSError as error:
            raise OSError(
                error.errno,
                f"a block of {_mib(size)} for the record workers' rows fits neither in "
                f"/dev/shm nor in {self.folder} ({error.strerror}); free space there, or "
                f"{REMEDIES}.",
            ) from error

    def _to_files(self, why: str) -> None:
        _remove_orphans()
        self.folder = tempfile.mkdtemp(prefix=f"{FOLDER_PREFIX}{os.getpid()}-")
        _say(
            f"{why}; the rows go through memory-mapped files in {self.folder} instead "
            f"(slower than /dev/shm). To keep them in shared memory, {REMEDIES}."
        )

    def close(self) -> None:
        """Removes the files' folder (its blocks are unlinked by their owner first)."""
        if self.folder is not None:
            remove_folder(self.folder)


def _remove_orphans() -> None:
    """Removes files folders left by loading processes that were killed."""
    for folder in glob.glob(os.path.join(tempfile.gettempdir(), f"{FOLDER_PREFIX}*-*")):
        pid = os.path.basename(folder)[len(FOLDER_PREFIX) :].split("-", 1)[0]
        if not pid.isdigit():
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            remove_folder(folder)
        except OSError:  # alive, someone else's
            continue
