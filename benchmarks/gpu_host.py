"""A GPU host at the speed of its cores: what the loading process costs, what a host feeds.

ImageNet-size rows (224x224x3 uint8) into global ``jax.Array`` batches on every device of
the host; each entry a fresh process, rotating rounds, medians of the per-round ratios.
Workloads (``workload:entry``): ``place`` (rows in memory: meshfeed vs ``jax.device_put``
of ready batches, GB/s); ``ceiling`` (``W`` workers copying the row: images/s and the
loading process's CPU a step over one memcpy of the batch); ``decode`` (JPEG 256 ->
random 224 crop + flip: ``W`` workers vs ``L`` plain loops at once vs the PyTorch
DataLoader); ``model`` (a small convnet: ``fit`` fed by ``decode`` or nvImageCodec vs its
step on a batch already on the devices); ``vision`` (375x500 JPEGs through
``RandomResizedCrop(224)``: Pillow in workers, nvImageCodec in the loading process --
goal >= 2x the loops with ``--platform gpu`` -- and ``L`` plain loops).
``--platform cpu`` (the default): 8 CPU devices, batch 64; ``--platform gpu``: the
host's GPUs, batch 256, 15 workers, 16 loops. ``--smoke`` for CI (every entry once, in
one child process). This file is the parent; what the children run is ``gpu_entries``.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable
from importlib.util import find_spec
from pathlib import Path
from typing import Any

from harness import arguments, emit, median_of, median_ratio, use_cpu_devices

HERE = Path(__file__).resolve().parent
ROW_BYTES = 224 * 224 * 3

PLATFORMS = ("cpu", "gpu", "smoke")
SIZE_TABLE = {  # per size: its value on "cpu", "gpu" and "smoke"
    "batch": (64, 256, 16),
    "rows": (512, 2048, 64),  # rows in memory
    "jpegs": (512, 2048, 48),
    "ceiling": ([1, 2], [15, 2], [1]),  # ceiling workers
    "place_threads": ([1, 2], [0, 2, 4, 8], [2]),
    "workers": (2, 15, 1),  # decode workers
    "loops": (2, 16, 1),
    "seconds": (2.0, 3.0, 0.3),  # an entry's window
    "model": ("tiny", "convnet", "tiny"),
    "vision_jpegs": (256, 1024, 32),
    "decoder": ("nvimgcodec-cpu", "nvimgcodec-gpu", "nvimgcodec-cpu"),
}
SIZES = {name: {k: v[i] for k, v in SIZE_TABLE.items()} for i, name in enumerate(PLATFORMS)}


def _names(cfg: dict[str, Any], torch: bool, nvimgcodec: bool) -> list[str]:
    vision = ["vision:pillow", "vision:loops"]
    if nvimgcodec:
        vision += ["vision:nvimgcodec", "model:fit-nvimgcodec"]
    names = [
        "place:meshfeed",
        "place:device_put",
        *(f"ceiling:{w}" for w in cfg["ceiling"]),
        *(f"ceiling:{cfg['ceiling'][0]}:t{t}" for t in cfg["place_threads"]),
        "decode:meshfeed",
        "decode:loops",
        "model:synthetic",
        "model:fit",
        *vision,
    ]
    return names + (["decode:torch"] if torch else [])


def _run_child(name: str, cfg_file: str, env: dict[str, str]) -> dict[str, Any]:
    return _run_children([name], cfg_file, env)[name]


def _run_children(names: list[str], cfg_file: str, env: dict[str, str]) -> dict[str, Any]:
    """``names`` run one after another in one fresh process (one each, to be timed)."""
    done = subprocess.run(
        [sys.executable, __file__, "--child", ",".join(names), "--config", cfg_file],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    if done.returncode != 0:
        raise RuntimeError(f"{','.join(names)} failed:\n{done.stderr[-3000:]}")
    lines = done.stdout.strip().splitlines()[-len(names) :]
    return {name: json.loads(line) for name, line in zip(names, lines, strict=True)}


def _flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--platform", choices=["cpu", "gpu"], default="cpu")
    parser.add_argument(
        "--only", default="", help="comma-separated workloads or entries (place, ceiling:1)"
    )
    parser.add_argument(
        "--src", default="", help="a meshfeed checkout's src/ to time instead (a build before)"
    )
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--config", help=argparse.SUPPRESS)


def _write_config(cfg: dict[str, Any]) -> str:
    """The JPEGs pickled for the children, and the config naming them; its path."""
    from gpu_fns import make_jpegs

    folder = tempfile.mkdtemp(prefix="meshfeed-gpu-host-")
    cfg["jpeg_file"] = os.path.join(folder, "jpegs.pkl")
    with open(cfg["jpeg_file"], "wb") as f:
        pickle.dump(make_jpegs(cfg["jpegs"]), f)
    cfg["vision_file"] = os.path.join(folder, "vision.pkl")
    with open(cfg["vision_file"], "wb") as f:  # ImageNet training images' size
        pickle.dump(make_jpegs(cfg["vision_jpegs"], seed=1, height=375, width=500), f)
    cfg_file = os.path.join(folder, "config.json")
    with open(cfg_file, "w") as f:
        json.dump(cfg, f)
    return cfg_file


def main() -> None:
    args = arguments(__doc__, rounds=5, add=_flags)
    if args.child:
        from gpu_entries import run_entries

        with open(args.config) as f:
            run_entries(args.child, json.load(f))
        return
    if args.platform == "cpu":
        use_cpu_devices()
    cfg = dict(SIZES["smoke" if args.smoke else args.platform])
    env = dict(os.environ)
    if args.src:  # the children import that meshfeed (the benchmark's helpers stay these)
        env["PYTHONPATH"] = os.pathsep.join([args.src, env.get("PYTHONPATH", "")]).strip(os.pathsep)
    sys.path.insert(0, str(HERE))
    cfg_file = _write_config(cfg)
    nvimgcodec = find_spec("nvidia") is not None and find_spec("nvidia.nvimgcodec") is not None
    names = _names(cfg, find_spec("torch") is not None, nvimgcodec)
    if args.only:
        wanted = set(args.only.split(","))
        names = [n for n in names if n in wanted or n.split(":")[0] in wanted]
    per_round: list[dict[str, dict[str, Any]]] = []
    for r in range(args.rounds):
        if args.smoke:  # one process for all: the smoke checks that each runs
            per_round.append(_run_children(names, cfg_file, env))
            continue
        got = {}
        for name in names[r % len(names) :] + names[: r % len(names)]:
            got[name] = _run_child(name, cfg_file, env)
        per_round.append(got)
    _report(per_round, names, cfg, args)


def _report(
    per_round: list[dict[str, dict[str, Any]]],
    names: list[str],
    cfg: dict[str, Any],
    args: argparse.Namespace,
) -> None:
    batch = cfg["batch"]

    def ratio(a: str, b: str) -> float | None:
        return median_ratio(per_round, a, b, "steps_per_s", digits=4)

    def median(fn: Callable[[dict[str, Any]], float], name: str) -> float:
        return round(statistics.median(fn(r[name]) for r in per_round), 4)

    first = per_round[0][names[0]]
    common = {
        "device": first["device"],
        "platform": first["platform"],
        "devices": int(first["device"].split(" x ")[0]),
        "processes": 1,
        "cores": os.cpu_count(),
        "global_batch_size": batch,
        "rounds": args.rounds,
        "window_s": cfg["seconds"],
        "build": args.src or "this",
    }
    for name in names:
        workload, entry = name.split(":", 1)
        line: dict[str, Any] = {**common, "workload": workload, "name": entry}
        images_per_s = batch * (median_of(per_round, name, "steps_per_s") or 0.0)
        line["images_per_s"] = round(images_per_s)
        if workload in ("place", "ceiling"):
            line["gb_per_s"] = round(images_per_s * ROW_BYTES / 1e9, 3)
            line["loader_cpu_ms_per_step"] = median(lambda g: g["cpu_ms_per_step"], name)
        if name == "place:meshfeed" and "place:device_put" in names:
            line["ratio_to_device_put"] = ratio(name, "place:device_put")
        if workload == "ceiling":
            line["workers"] = int(entry.split(":")[0])
            line["place_threads"] = entry.split(":t")[1] if ":t" in entry else "auto"
            if ":t" in entry:
                line["ratio_to_auto"] = ratio(name, f"ceiling:{line['workers']}")
            line["memcpy_ms"] = median(lambda g: g["memcpy_ms"], name)
            line["cpu_per_memcpy"] = median(lambda g: g["cpu_ms_per_step"] / g["memcpy_ms"], name)
        if workload in ("decode", "vision"):
            workers = {"loops": cfg["loops"], "nvimgcodec": 0}
            line["workers"] = workers.get(entry, cfg["workers"])
            for peer in ("loops", "torch", "pillow"):
                if entry != peer and f"{workload}:{peer}" in names:
                    line[f"ratio_to_{peer}"] = ratio(name, f"{workload}:{peer}")
            if name == "vision:nvimgcodec":
                line["decoder"] = per_round[0][name]["decoder"]
        if name in ("model:fit", "model:fit-nvimgcodec"):
            line["input_wait_share"] = median(lambda g: g["input_wait"], name)
            line["workers"] = cfg["workers"] if name == "model:fit" else 0
            if "model:synthetic" in names:
                line["ratio_to_synthetic"] = ratio(name, "model:synthetic")
        emit("gpu_host", smoke=args.smoke, **line)


if __name__ == "__main__":
    main()
