"""Loaders with 2 record-worker processes, for the tests of a small /dev/shm.

``python small_shm_job.py`` runs, one after another: two epochs of small rows (a step's
blocks fit a few times in an 8 MiB /dev/shm: the read-ahead is cut), two epochs of
large rows (not even two steps fit: the rows go through files), a batch that grows
after another process filled a small /dev/shm (the new blocks go to files), a loader
dropped after two steps and garbage-collected, a loader whose worker is SIGKILLed
mid-epoch, and loading processes SIGKILLed mid-epoch (/dev/shm blocks, then files). It
prints one JSON line (``hashes``: the first three runs only): each run's hash of every
batch, the depth it read ahead at most, the error of the killed run, and what /dev/shm
and the temporary folder hold after each.
The test runs it under a private 8 MiB /dev/shm (``unshare``) and with /dev/shm as it is.
"""

from __future__ import annotations

import gc
import glob
import hashlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from typing import Any

import jax

jax.config.update("jax_num_cpu_devices", 2)

import numpy as np  # noqa: E402

import meshfeed  # noqa: E402

N, BATCH = 192, 32


def widen(record, rng):
    """uint8 rows to float32, with noise from the example's generator."""
    x = record["x"].astype(np.float32)
    return {"x": x + rng.random(x.shape, dtype=np.float32), "y": record["y"]}


def loader(side: int, global_batch_size: Any = BATCH, **kwargs: Any) -> meshfeed.Loader:
    rng = np.random.default_rng(0)
    source = meshfeed.ArraySource(
        {
            "x": rng.integers(0, 256, (N, side, side, 3), dtype=np.uint8),
            "y": np.arange(N, dtype=np.int32),
        }
    )
    mesh = meshfeed.make_mesh(data=2)
    return meshfeed.Loader(
        source,
        global_batch_size=global_batch_size,
        sharding=meshfeed.batch_sharding(mesh),
        record_transform=widen,
        num_workers=2,
        **kwargs,
    )


def ours() -> dict[str, list[str]]:
    """What this process's loaders may have left: /dev/shm blocks, files folders."""
    folders = glob.glob(os.path.join(tempfile.gettempdir(), "meshfeed-rows-*"))
    shm = os.listdir("/dev/shm") if os.path.isdir("/dev/shm") else []
    return {"shm": sorted(shm), "folders": sorted(folders)}


def run(side: int, *, fill: bool = False, **kwargs: Any) -> dict[str, object]:
    """Hashes every batch; with ``fill``, fills /dev/shm after the first batch."""
    feed = loader(side, **{"num_epochs": 2, **kwargs})
    digest, depth, filler = hashlib.sha256(), 0, None
    for batch in feed:
        for name in sorted(batch):
            digest.update(np.asarray(batch[name]).tobytes())
        depth = max(depth, feed.prefetch_depth)
        if fill and filler is None:  # another process takes what /dev/shm has left
            filler = os.open("/dev/shm/filler", os.O_CREAT | os.O_RDWR)
            free = os.statvfs("/dev/shm")
            os.posix_fallocate(filler, 0, free.f_bavail * free.f_frsize)
    feed.close()
    if filler is not None:
        os.close(filler)
        os.unlink("/dev/shm/filler")
    return {"hash": digest.hexdigest(), "depth": depth, "left": ours()}


def dropped(side: int) -> dict[str, object]:
    feed = loader(side)
    for _, _ in zip(feed, range(2), strict=False):
        pass
    del feed
    gc.collect()
    return {"left": ours()}


def workers() -> list[int]:
    """This process's record workers (children running the worker loop)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                command = f.read()
        except OSError:
            continue
        if ppid == os.getpid() and b"_worker_loop" in command:
            found.append(int(pid))
    return found


def killed(side: int) -> dict[str, object]:
    feed = loader(side, num_epochs=None, prefetch=2)
    error = ""
    try:
        for step, _ in enumerate(feed):
            if step == 2:
                os.kill(workers()[0], signal.SIGKILL)
            if step == 100:
                break
    except RuntimeError as e:
        error = str(e)
    feed.close()
    return {"error": error, "left": ours()}


def suicide(side: int) -> None:
    """Loads two steps, then this process is SIGKILLed (its workers live on)."""
    feed = loader(side, num_epochs=None)
    for step, _ in enumerate(feed):
        if step == 2:
            os.kill(os.getpid(), signal.SIGKILL)


def killed_loader(side: int) -> dict[str, object]:
    """What a loading process SIGKILLed mid-epoch leaves, once its helpers saw it."""
    subprocess.run([sys.executable, __file__, "suicide", str(side)], check=False)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(ours().values()):
        time.sleep(0.1)
    return {"left": ours()}


if __name__ == "__main__":
    if sys.argv[1:2] == ["suicide"]:
        suicide(int(sys.argv[2]))
    small, large = 24, 96  # float32 rows of 6.8 KiB and 108 KiB, 32 a step
    tiny = os.path.isdir("/dev/shm") and os.statvfs("/dev/shm").f_blocks * 4096 < 64 << 20
    out = {
        "small": run(small),
        "large": run(large),
        # The batch grows at step 3 (new blocks), after /dev/shm was filled.
        "filled": run(small, fill=tiny, global_batch_size=[(0, 32), (3, 64)], prefetch=1),
    }
    if sys.argv[1:2] == ["hashes"]:  # the runs to compare with, and nothing else
        print(json.dumps(out))
        sys.exit(0)
    out |= {
        "dropped": dropped(large),
        "killed": killed(small),
        "killed_loader_shm": killed_loader(small),
        "killed_loader_files": killed_loader(large),
    }
    print(json.dumps(out))
    sys.stdout.flush()
