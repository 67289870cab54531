"""Faults of a real run, timed: bad records skipped, and rows through files when /dev/shm is small.

Two workloads, each ending in global ``jax.Array`` batches on 8 CPU devices
(``batch_sharding(make_mesh(data=8))``), read by ``Loader(record_transform=...,
num_workers=2)`` with worker processes:

- F, bad records: workload C (``decode_throughput.py``: PNG-encoded 32x32 RGB images,
  decoded and randomly cropped per record, global batch 256), where 1% of the images
  (the ids divisible by 100) are cut to their first half, so the record transform
  raises ``ValueError`` on them. Entries: ``clean`` (no bad image, ``on_error="raise"``),
  ``bad 1%, skip`` (the bad images, ``on_error="skip"``) and ``clean, skip`` (no bad
  image, ``on_error="skip"``: what the mode costs alone, its ``mask`` field). The lines
  also give the examples skipped in every full epoch handed out, against the bad ids
  the schedule put in it. Goal: ``bad 1%, skip`` >= 0.95x ``clean``.
- G, the file-backed transport: 64 rows a step of 96x96x3 uint8 images turned into
  float32 with one level of uniform noise from each example's generator (a cheap record
  transform, so the transport's cost shows; 6.75 MiB of output rows a step). Each entry
  runs in a child process started by ``unshare -rm`` (a user and mount namespace, no
  root needed): ``shm`` with /dev/shm as it is, ``files`` under a private 8 MiB tmpfs on
  /dev/shm, too small for two steps, so the rows go through memory-mapped files in
  TMPDIR. The child checks that they did (meshfeed's line on stderr, and block files in
  its ``meshfeed-rows-*`` folder while the loader runs). Goal: ``files`` >= 0.75x
  ``shm``. The same children also time a medium step (64 rows of 32x32x3, 1 MiB a step
  with its inputs), which fits a few steps in half of the 8 MiB: there the read-ahead is
  cut to fit (``read-ahead cut``) instead.

Every round times each entry once (a child times its two loaders), in an order that
rotates from round to round; ratios are taken within a round, and the lines give
medians over rounds. Prints one JSON line per entry; ``--smoke`` for CI.
"""

from __future__ import annotations

import os

os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import argparse
import collections
import contextlib
import gc
import glob
import json
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

import jax
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fault_fns import decode_crop_checked, dequantize, images, is_bad, pngs

import meshfeed
from common import measure

BATCH = 256  # workload F
ROWS_BATCH = 64  # workload G
SIDES = {"large": 96, "medium": 32}  # workload G's images, and the medium step's
SMALL_SHM = "8m"
MAX_SKIPPED = 0.02  # the default budget, 1%, is what the data holds: a run could trip it
MOUNT = f'mount -t tmpfs -o size={SMALL_SHM} tmpfs /dev/shm && exec "$@"'


def _sharding() -> Any:
    return meshfeed.batch_sharding(meshfeed.make_mesh(data=8))


def _skips(loader: meshfeed.Loader) -> dict[str, Any]:
    """The examples skipped in each full epoch handed out, and the bad ids in one."""
    per_epoch = loader.steps_per_epoch
    assert per_epoch is not None
    epochs = loader.step // per_epoch
    counts = collections.Counter(s.step // per_epoch for s in loader.skipped)
    bad = [
        int(
            is_bad(
                np.concatenate([loader.ids(s) for s in range(e * per_epoch, (e + 1) * per_epoch)])
            ).sum()
        )
        for e in range(epochs)
    ]
    return {
        "skipped": [counts[e] for e in range(epochs)],
        "bad": bad,
        "all_bad": all(bool(is_bad(np.asarray([s.example]))[0]) for s in loader.skipped),
        "error": loader.skipped[0].error if loader.skipped else None,
    }


def _records(source: dict[str, np.ndarray], on_error: str, seconds: float) -> dict[str, Any]:
    """Workload F: records/s of the decode loader over ``source``, and its skips."""
    skip = {"max_skipped": MAX_SKIPPED} if on_error == "skip" else {}
    loader = meshfeed.Loader(
        meshfeed.ArraySource(source),
        global_batch_size=BATCH,
        sharding=_sharding(),
        record_transform=decode_crop_checked,
        num_workers=2,
        num_epochs=None,
        on_error=on_error,  # type: ignore[arg-type]
        **skip,  # type: ignore[arg-type]
    )
    try:
        rate = measure(lambda: iter(loader), BATCH, seconds, warmup=5)
        return {"rate": rate, **_skips(loader)}
    finally:
        loader.close()


class _Tee:
    """Writes to ``stream`` and keeps the lines meshfeed says."""

    def __init__(self, stream: TextIO) -> None:
        self.stream, self.said, self._line = stream, [], ""

    def write(self, text: str) -> int:
        self._line += text
        *lines, self._line = self._line.split("\n")
        self.said += [line for line in lines if line.startswith("meshfeed: ")]
        return self.stream.write(text)

    def flush(self) -> None:
        self.stream.flush()


def _rows(side: int, n: int, seconds: float) -> dict[str, Any]:
    """Workload G in this process: records/s, and where the rows went."""
    tee = _Tee(sys.stderr)
    with contextlib.redirect_stderr(tee):  # type: ignore[type-var]
        loader = meshfeed.Loader(
            meshfeed.ArraySource(images(n, side)),
            global_batch_size=ROWS_BATCH,
            sharding=_sharding(),
            record_transform=dequantize,
            num_workers=2,
            num_epochs=None,
        )
        try:
            rate = measure(lambda: iter(loader), ROWS_BATCH, seconds, warmup=5)
            folders = glob.glob(
                os.path.join(tempfile.gettempdir(), f"meshfeed-rows-{os.getpid()}-*")
            )
            blocks = [entry for folder in folders for entry in os.scandir(folder)]
            files = len(blocks), sum(entry.stat().st_size for entry in blocks) / 2**20
        finally:
            loader.close()
    return {"rate": rate, "file_blocks": files[0], "file_mib": files[1], "said": tee.said}


def _child(args: argparse.Namespace) -> None:
    """Times workload G's large and medium steps here; prints one JSON line."""
    stat = os.statvfs("/dev/shm")
    out: dict[str, Any] = {"shm_mib": round(stat.f_blocks * stat.f_frsize / 2**20, 1)}
    names = list(SIDES)
    for name in names[args.first % 2 :] + names[: args.first % 2]:
        out[name] = _rows(SIDES[name], args.examples, args.seconds)
        gc.collect()
        time.sleep(0.3)
    print(json.dumps(out), flush=True)


def _unshare_fails() -> str | None:
    """Why a private small /dev/shm cannot be had here, or ``None``."""
    try:
        run = subprocess.run(
            ["unshare", "-rm", "sh", "-c", MOUNT, "sh", "true"], capture_output=True, text=True
        )
    except OSError as error:
        return f"unshare cannot run: {error}"
    if run.returncode:
        return f"unshare -rm + mount failed: {run.stderr.strip().splitlines()[-1:]}"
    return None


def _children(small: bool, first: int, n: int, seconds: float) -> dict[str, Any]:
    """Workload G in a child process under ``unshare -rm``, with a private 8 MiB
    /dev/shm if ``small`` (else /dev/shm as it is)."""
    script = MOUNT if small else 'exec "$@"'
    command = [sys.executable, __file__, "--child", "--first", str(first)]
    command += ["--examples", str(n), "--seconds", str(seconds)]
    run = subprocess.run(
        ["unshare", "-rm", "sh", "-c", script, "sh", *command], capture_output=True, text=True
    )
    if run.returncode:
        raise RuntimeError(f"the child failed ({run.returncode}): {run.stderr[-2000:]}")
    return json.loads(run.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="tiny data and timings, for CI")
    parser.add_argument("--seconds", type=float, default=2.0, help="per entry per round")
    parser.add_argument("--rounds", type=int, default=7, help="rounds; the median")
    parser.add_argument("--examples", type=int, default=8192, help="workload F's images")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--first", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        _child(args)
        return
    seconds, rounds, n = (
        (0.3, 1, 2048) if args.smoke else (args.seconds, args.rounds, args.examples)
    )
    rows_n = 256 if args.smoke else 1024
    clean, bad = pngs(n)
    no_unshare = _unshare_fails()
    tasks: dict[str, Callable[[int], Any]] = {
        "clean": lambda r: _records(clean, "raise", seconds),
        "bad 1%, skip": lambda r: _records(bad, "skip", seconds),
        "clean, skip": lambda r: _records(clean, "skip", seconds),
    }
    if no_unshare is None:
        tasks["shm"] = lambda r: _children(False, r, rows_n, seconds)
        tasks["small shm"] = lambda r: _children(True, r, rows_n, seconds)
    names = list(tasks)
    per_round: list[dict[str, Any]] = []
    for r in range(rounds):
        got: dict[str, Any] = {}
        for name in names[r % len(names) :] + names[: r % len(names)]:
            got[name] = tasks[name](r)
            gc.collect()
            time.sleep(0.3)  # let the entry's workers go before the next one starts
        per_round.append(got)

    def median(fn: Callable[[dict[str, Any]], float]) -> float:
        return round(statistics.median(fn(r) for r in per_round), 3)

    common = {
        "benchmark": "faults",
        "num_workers": 2,
        "rounds": rounds,
        "window_s": seconds,
        "devices": jax.device_count(),
        "smoke": args.smoke,
        "jax": jax.__version__,
        "python": platform.python_version(),
    }
    for name in ("clean", "bad 1%, skip", "clean, skip"):
        line: dict[str, Any] = {
            **common,
            "workload": "F",
            "name": name,
            "global_batch_size": BATCH,
            "examples": n,
            "records_per_s": round(median(lambda r, name=name: r[name]["rate"])),
        }
        if name != "clean":
            ratio = [r[name]["rate"] / r["clean"]["rate"] for r in per_round]
            line["ratio_to_clean"] = round(statistics.median(ratio), 3)
            line["ratio_by_round"] = [round(x, 3) for x in ratio]
            skipped = [c for r in per_round for c in r[name]["skipped"]]
            line["skipped_per_epoch"] = sorted(set(skipped))  # every full epoch handed out
            line["epochs_counted"] = len(skipped)
        if name == "bad 1%, skip":
            skipped = [c for r in per_round for c in r[name]["skipped"]]
            bad_ids = [c for r in per_round for c in r[name]["bad"]]
            line["bad_per_epoch"] = sorted(set(bad_ids))
            line["skipped_are_the_bad"] = skipped == bad_ids and all(
                r[name]["all_bad"] for r in per_round
            )
            line["error"] = per_round[-1][name]["error"]
            line["goal"] = 0.95
        print(json.dumps(line), flush=True)
    for step, goal, entries in (
        ("large", 0.75, ("transport shm", "transport files")),
        ("medium", None, ("read-ahead shm", "read-ahead cut")),
    ):
        side = SIDES[step]
        for name in entries:
            line = {
                **common,
                "workload": "G",
                "name": name,
                "global_batch_size": ROWS_BATCH,
                "row": f"{side}x{side}x3 float32",
                "examples": rows_n,
            }
            if no_unshare is not None:
                line["skipped"] = no_unshare
                print(json.dumps(line), flush=True)
                continue
            where = "small shm" if name.endswith(("files", "cut")) else "shm"
            line["shm_mib"] = per_round[0][where]["shm_mib"]
            line["records_per_s"] = round(median(lambda r, s=step, w=where: r[w][s]["rate"]))
            line["mib_per_s"] = round(line["records_per_s"] * side * side * 3 * 4 / 2**20, 1)
            if where == "small shm":
                ratio = [r["small shm"][step]["rate"] / r["shm"][step]["rate"] for r in per_round]
                line["ratio_to_shm"] = round(statistics.median(ratio), 3)
                line["ratio_by_round"] = [round(x, 3) for x in ratio]
                if goal is not None:
                    line["goal"] = goal
            line["file_blocks"] = max(r[where][step]["file_blocks"] for r in per_round)
            line["file_mib"] = round(max(r[where][step]["file_mib"] for r in per_round), 1)
            line["meshfeed_said"] = per_round[0][where][step]["said"]
            print(json.dumps(line), flush=True)


if __name__ == "__main__":
    main()
