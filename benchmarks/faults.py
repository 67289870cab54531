"""Faults of a real run, timed: bad records skipped, and rows through files when /dev/shm is small.

F: workload C with 1% of its PNGs cut in half, ``on_error="skip"`` against clean data
(goal >= 0.95x). G: rows of a cheap record transform in children under ``unshare -rm``, a
private 8 MiB /dev/shm (rows through memory-mapped files, or a read-ahead cut to fit)
against /dev/shm as it is (goal >= 0.75x). Rotating rounds, medians of per-round ratios.
``--smoke`` for CI; the workloads are in ``benchmarks/README.md``.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import gc
import glob
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any, TextIO

import numpy as np
from fault_fns import decode_crop_checked, dequantize, is_bad, pngs
from harness import arguments, emit, in_rounds, median_of, use_cpu_devices
from workload_fns import images

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


def _flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--examples", type=int, default=8192, help="workload F's images")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--first", type=int, default=0, help=argparse.SUPPRESS)


def _ratios(a: list[float], b: list[float]) -> dict[str, Any]:
    """The median of per-round ratios ``a / b``, and each round's."""
    ratio = [x / y for x, y in zip(a, b, strict=True)]
    return {"median": round(statistics.median(ratio), 3), "by_round": [round(x, 3) for x in ratio]}


def main() -> None:
    use_cpu_devices()
    smoke = {"seconds": 0.3, "rounds": 1, "examples": 2048}
    args = arguments(__doc__, seconds=2.0, rounds=7, smoke=smoke, add=_flags)
    if args.child:
        _child(args)
        return
    seconds = args.seconds
    n = args.examples
    rows_n = 256 if args.smoke else 1024
    clean, bad = pngs(n)
    no_unshare = _unshare_fails()
    tasks: dict[str, Callable[[], Any]] = {
        "clean": lambda: _records(clean, "raise", seconds),
        "bad 1%, skip": lambda: _records(bad, "skip", seconds),
        "clean, skip": lambda: _records(clean, "skip", seconds),
    }
    if no_unshare is None:
        # Two children a round; the round's number picks which step size a child times first.
        calls = itertools.count()
        tasks["shm"] = lambda: _children(False, next(calls) // 2, rows_n, seconds)
        tasks["small shm"] = lambda: _children(True, next(calls) // 2, rows_n, seconds)
    per_round = in_rounds(tasks, args.rounds)
    run = {"num_workers": 2, "rounds": args.rounds, "window_s": seconds, "smoke": args.smoke}
    clean_rates = [r["clean"]["rate"] for r in per_round]
    for name in ("clean", "bad 1%, skip", "clean, skip"):
        line: dict[str, Any] = {"workload": "F", "name": name, "global_batch_size": BATCH}
        line["examples"] = n
        line["records_per_s"] = round(median_of(per_round, name, "rate") or 0)
        if name != "clean":
            ratio = _ratios([r[name]["rate"] for r in per_round], clean_rates)
            line["ratio_to_clean"] = ratio["median"]
            line["ratio_by_round"] = ratio["by_round"]
            skipped = [c for r in per_round for c in r[name]["skipped"]]
            line["skipped_per_epoch"] = sorted(set(skipped))  # every full epoch handed out
            line["epochs_counted"] = len(skipped)
        if name == "bad 1%, skip":
            skipped = [c for r in per_round for c in r[name]["skipped"]]
            bad_ids = [c for r in per_round for c in r[name]["bad"]]
            line["bad_per_epoch"] = sorted(set(bad_ids))
            all_bad = all(r[name]["all_bad"] for r in per_round)
            line["skipped_are_the_bad"] = skipped == bad_ids and all_bad
            line["error"] = per_round[-1][name]["error"]
            line["goal"] = 0.95
        emit("faults", **run, **line)
    for step, goal, entries in (
        ("large", 0.75, ("transport shm", "transport files")),
        ("medium", None, ("read-ahead shm", "read-ahead cut")),
    ):
        side = SIDES[step]
        for name in entries:
            line = {"workload": "G", "name": name, "global_batch_size": ROWS_BATCH}
            line |= {"row": f"{side}x{side}x3 float32", "examples": rows_n}
            if no_unshare is not None:
                emit("faults", **run, **line, skipped=no_unshare)
                continue
            where = "small shm" if name.endswith(("files", "cut")) else "shm"
            line["shm_mib"] = per_round[0][where]["shm_mib"]
            rates = [r[where][step]["rate"] for r in per_round]
            line["records_per_s"] = round(statistics.median(rates))
            line["mib_per_s"] = round(line["records_per_s"] * side * side * 3 * 4 / 2**20, 1)
            if where == "small shm":
                ratio = _ratios(rates, [r["shm"][step]["rate"] for r in per_round])
                line["ratio_to_shm"] = ratio["median"]
                line["ratio_by_round"] = ratio["by_round"]
                if goal is not None:
                    line["goal"] = goal
            line["file_blocks"] = max(r[where][step]["file_blocks"] for r in per_round)
            line["file_mib"] = round(max(r[where][step]["file_mib"] for r in per_round), 1)
            line["meshfeed_said"] = per_round[0][where][step]["said"]
            emit("faults", **run, **line)


if __name__ == "__main__":
    main()
