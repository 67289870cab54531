"""A GPU host at the speed of its cores: what the loading process costs, what a host feeds.

Each ``workload:entry`` timed in a fresh process (``--child``; ``--smoke``: all in one);
``--platform gpu``: the host's GPUs, batch 256, 15 workers, 16 loops. README.md says more.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import pickle
import statistics
import tempfile
import time
import timeit
from collections.abc import Callable, Iterator
from functools import partial
from importlib.util import find_spec
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
import psutil
from harness import arguments, emit, in_rounds, median_of, median_ratio, run_child, use_cpu_devices
from worker_fns import LOOP, ROW, copy_row, decode_crop_flip, load_jpegs, make_jpegs
from workload_fns import images

import meshfeed
from common import Records, loops_at_once, torch_batches

HERE = Path(__file__).resolve().parent

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


# What a child process runs: each entry's workload, timed.
def children_cpu() -> float:
    """CPU seconds of this process's live children (the record workers)."""
    total = 0.0
    for child in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error):
            total += sum(child.cpu_times()[:2])  # user, system
    return total


def timed(batches: Iterator[Any], seconds: float, warmup: int = 5) -> dict[str, float]:
    """Steps a second over ``seconds`` of steady state (3 steps at least), and the CPU a
    step, milliseconds, of this process and of its children (the record workers)."""
    for _ in range(warmup):
        jax.block_until_ready(next(batches))
    children = children_cpu()
    steps, cpu, start = 0, time.process_time(), time.perf_counter()
    while True:
        jax.block_until_ready(next(batches))
        steps += 1
        elapsed = time.perf_counter() - start
        if elapsed >= seconds and steps >= 3:
            break
    cpu_ms = 1e3 * (time.process_time() - cpu) / steps
    children_ms = 1e3 * (children_cpu() - children) / steps
    return {"steps_per_s": steps / elapsed, "cpu_ms_per_step": cpu_ms, "children_ms": children_ms}


def _rows(n: int) -> Any:
    return images(n, ROW[0]) | {"label": np.arange(n, dtype=np.int32)}


def _sharding() -> Any:
    return meshfeed.batch_sharding(meshfeed.make_mesh(data=jax.device_count()))


def array_loader(source: dict[str, Any], batch: int, **options: Any) -> meshfeed.Loader:
    """An endless ``Loader`` over ``source``'s arrays, its batches on every device."""
    return meshfeed.Loader(
        meshfeed.ArraySource(source),
        global_batch_size=batch,
        sharding=_sharding(),
        num_epochs=None,
        **options,
    )


def _jpegs(cfg: dict[str, Any], file: str = "jpeg_file", field: str = "jpeg") -> dict[str, Any]:
    """The JPEGs of ``cfg[file]`` as a source's columns: ``field`` (bytes) and a label."""
    jpegs = load_jpegs(cfg[file])
    column = np.empty(len(jpegs), object)
    column[:] = jpegs
    return {field: column, "label": np.arange(len(jpegs), dtype=np.int32) % 1000}


def _decode_loader(cfg: dict[str, Any]) -> Any:
    options = {"record_transform": decode_crop_flip, "num_workers": cfg["workers"]}
    return array_loader(_jpegs(cfg), cfg["batch"], **options)


def _vision_loader(cfg: dict[str, Any], decoder: str) -> Any:
    """ImageNet-size JPEGs through ``RandomResizedCrop(224)``: Pillow in ``W`` workers, or
    another decoder (nvImageCodec) in the loading process."""
    import meshfeed.vision  # here: a build before (``--src``) may not have it

    crop = meshfeed.vision.RandomResizedCrop(224, decoder=decoder)  # type: ignore[arg-type]
    workers = cfg["workers"] if decoder == "pillow" else 0
    jpegs = _jpegs(cfg, "vision_file", "image")
    return array_loader(jpegs, cfg["batch"], record_transform=crop, num_workers=workers)


def _feed(loader: Any, cfg: dict[str, Any], **figures: Callable[[Any], Any]) -> dict[str, Any]:
    """``timed`` over ``loader``, then closed; ``figures``: more, read from the loader."""
    with contextlib.closing(loader):
        got: dict[str, Any] = timed(iter(loader), cfg["seconds"])
        return got | {name: figure(loader) for name, figure in figures.items()}


def _place_device_put(cfg: dict[str, Any]) -> dict[str, float]:
    rows, sharding, rng = _rows(cfg["rows"]), _sharding(), np.random.default_rng(1)
    ids = [rng.choice(cfg["rows"], cfg["batch"], replace=False) for _ in range(8)]
    ready = [{k: v[i] for k, v in rows.items()} for i in ids]

    def batches() -> Iterator[Any]:
        while True:
            for b in ready:
                yield {k: jax.device_put(v, sharding) for k, v in b.items()}

    return timed(batches(), cfg["seconds"])


def _ceiling(cfg: dict[str, Any], workers: int, threads: int | None = None) -> dict[str, float]:
    options: dict[str, Any] = {} if threads is None else {"place_threads": threads}
    options |= {"record_transform": copy_row, "num_workers": workers}
    got = _feed(array_loader(_rows(cfg["rows"]), cfg["batch"], **options), cfg)
    src = np.ones((cfg["batch"], *ROW), np.uint8)
    dst = np.empty_like(src)  # one memcpy of the batch into a reused buffer, best of 20
    memcpy_s = min(timeit.repeat(lambda: np.copyto(dst, src), number=1, repeat=20))
    return got | {"memcpy_ms": 1e3 * memcpy_s}


class _Images(Records):
    """A map-style dataset for the DataLoader (decodes in its workers)."""

    def __getitem__(self, i: int) -> dict[str, Any]:
        record = {"jpeg": self.arrays["jpeg"][i], "label": int(self.arrays["label"][i])}
        return decode_crop_flip(record, np.random.default_rng(i))


def _decode_torch(cfg: dict[str, Any]) -> dict[str, float]:
    run = torch_batches(_Images(_jpegs(cfg)), cfg["batch"], workers=cfg["workers"])
    assert not isinstance(run, str), run  # the parent runs it only where torch is
    return timed(run(), cfg["seconds"])


def _loops(cfg: dict[str, Any], work: str, file: str) -> dict[str, float]:
    script = LOOP.format(
        here=str(HERE), work=work, source=cfg[file], seconds=cfg["seconds"], augment=False
    )
    return {"steps_per_s": loops_at_once(script, cfg["loops"]) / cfg["batch"]}


def _model(kind: str) -> tuple[Any, Callable[..., Any]]:
    """Parameters and loss of a small convnet on 224x224x3 uint8 images, 1000 classes."""
    rng = np.random.default_rng(0)
    convs = [(8, 8, 3, 16, 8)]  # height, width, in, out, stride
    if kind != "tiny":
        convs = [(7, 7, 3, 64, 4), (3, 3, 64, 128, 2), (3, 3, 128, 256, 2)]
    params = {
        f"conv{i}": (rng.normal(size=s[:4]) * np.sqrt(2 / np.prod(s[:3]))).astype(np.float32)
        for i, s in enumerate(convs)
    }
    params["dense"] = (rng.normal(size=(convs[-1][3], 1000)) * 0.01).astype(np.float32)

    def loss(p: Any, batch: Any) -> Any:
        x = batch["image"].astype(jnp.bfloat16 if kind != "tiny" else jnp.float32) / 255.0
        dims = ("NHWC", "HWIO", "NHWC")
        for i, s in enumerate(convs):
            w = p[f"conv{i}"].astype(x.dtype)
            x = jax.lax.conv_general_dilated(x, w, (s[4],) * 2, "SAME", dimension_numbers=dims)
            x = jax.nn.relu(x)
        logits = x.mean(axis=(1, 2)).astype(jnp.float32) @ p["dense"]
        losses = optax.softmax_cross_entropy_with_integer_labels(logits, batch["label"])
        return meshfeed.masked_mean(losses, batch), {}

    return params, loss


def _train(cfg: dict[str, Any], loader: Any, fed: bool) -> dict[str, float]:
    """``fit`` fed by ``loader`` (``fed``), or the step alone on its first batch."""
    params, loss = _model(cfg["model"])
    mesh = _sharding().mesh
    optimizer = optax.sgd(1e-3)
    state = meshfeed.TrainState.create(params, optimizer, mesh=mesh)
    step = meshfeed.make_train_step(loss, optimizer, mesh=mesh)
    first = loader.batch(0)
    state, _ = step(state, first)  # compiled outside the timed part
    jax.block_until_ready(state)
    with contextlib.closing(loader):
        if not fed:

            def batches() -> Iterator[Any]:
                nonlocal state
                while True:
                    state, _ = step(state, first)
                    yield state

            return timed(batches(), cfg["seconds"], warmup=2)
        steps = max(10, int(cfg["seconds"] * 4))
        history = meshfeed.fit(
            step, state, loader, num_steps=steps, log_every=steps, progress=False
        )
        for _ in range(3):  # the window grows until it is long enough
            if history.seconds >= cfg["seconds"]:
                break
            steps = int(steps * cfg["seconds"] / max(history.seconds, 1e-3) * 1.2) + 1
            history = meshfeed.fit(
                step, history.state, loader, num_steps=steps, log_every=steps, progress=False
            )
        return {
            "steps_per_s": history.steps / history.seconds,
            "input_wait": history.input_wait_share,
        }


def _entries(cfg: dict[str, Any]) -> dict[str, Callable[[], dict[str, Any]]]:
    """Every entry (``workload:entry``), in the order of the rounds and of the lines."""
    vision, first = cfg["decoder"], cfg["ceiling"][0]

    def decoder(loader: Any) -> Any:
        return loader.stats()["record_transform"].get("decoder", vision)

    return {
        "place:meshfeed": lambda: _feed(array_loader(_rows(cfg["rows"]), cfg["batch"]), cfg),
        "place:device_put": lambda: _place_device_put(cfg),
        **{f"ceiling:{w}": partial(_ceiling, cfg, w) for w in cfg["ceiling"]},
        **{f"ceiling:{first}:t{t}": partial(_ceiling, cfg, first, t) for t in cfg["place_threads"]},
        "decode:meshfeed": lambda: _feed(_decode_loader(cfg), cfg),
        "decode:loops": lambda: _loops(cfg, "crop_flip", "jpeg_file"),
        "model:synthetic": lambda: _train(cfg, _decode_loader(cfg), fed=False),
        "model:fit": lambda: _train(cfg, _decode_loader(cfg), fed=True),
        "vision:pillow": lambda: _feed(_vision_loader(cfg, "pillow"), cfg),
        "vision:loops": lambda: _loops(cfg, "resized_crop", "vision_file"),
        "vision:nvimgcodec": lambda: _feed(_vision_loader(cfg, vision), cfg, decoder=decoder),
        "model:fit-nvimgcodec": lambda: _train(cfg, _vision_loader(cfg, vision), fed=True),
        "decode:torch": lambda: _decode_torch(cfg),
    }


def _child(cfg: dict[str, Any]) -> None:
    """Runs the entries ``cfg["run"]`` (several in --smoke only) here, one after another;
    prints their figures, by name, as one JSON line."""
    runs = _entries(cfg)
    device = jax.devices()[0]
    where = {"device": f"{jax.device_count()} x {device.device_kind}", "platform": device.platform}
    print(json.dumps({one: runs[one]() | where for one in cfg["run"]}), flush=True)


def _flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--platform", choices=["cpu", "gpu"], default="cpu")
    parser.add_argument(
        "--only", default="", help="comma-separated workloads or entries (place, ceiling:1)"
    )
    parser.add_argument(
        "--src", default="", help="a meshfeed checkout's src/ to time instead (a build before)"
    )
    parser.add_argument("--child", help=argparse.SUPPRESS)  # the config, "run": the entries


def main() -> None:
    args = arguments(__doc__, rounds=5, add=_flags)
    if args.child:
        _child(json.loads(args.child))
        return
    if args.platform == "cpu":
        use_cpu_devices()
    cfg = dict(SIZES["smoke" if args.smoke else args.platform])
    env = dict(os.environ)
    if args.src:  # the children import that meshfeed (the benchmark's helpers stay these)
        env["PYTHONPATH"] = os.pathsep.join([args.src, env.get("PYTHONPATH", "")]).strip(os.pathsep)
    folder = tempfile.mkdtemp(prefix="meshfeed-gpu-host-")
    jpegs = {  # pickled for the children: 256x256, and ImageNet training images' size
        "jpeg_file": make_jpegs(cfg["jpegs"]),
        "vision_file": make_jpegs(cfg["vision_jpegs"], seed=1, height=375, width=500),
    }
    for key, data in jpegs.items():
        cfg[key] = os.path.join(folder, f"{key}.pkl")
        with open(cfg[key], "wb") as f:
            pickle.dump(data, f)
    nvimgcodec = find_spec("nvidia") is not None and find_spec("nvidia.nvimgcodec") is not None
    torch = find_spec("torch") is not None
    names = [
        name
        for name in _entries(cfg)
        if (torch or name != "decode:torch") and (nvimgcodec or "nvimgcodec" not in name)
    ]
    if args.only:
        wanted = set(args.only.split(","))
        names = [n for n in names if n in wanted or n.split(":")[0] in wanted]

    def child(*names: str) -> dict[str, Any]:
        """``names`` run one after another in one fresh process (one each, to be timed)."""
        return run_child(
            [__file__, "--child", json.dumps(cfg | {"run": names})], env=env, timeout=600
        )

    if args.smoke:  # one process for all: the smoke checks that each runs
        per_round = [child(*names)]
    else:
        per_round = in_rounds({n: lambda n=n: child(n)[n] for n in names}, args.rounds)
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

    def median(name: str, key: str) -> float:
        return round(median_of(per_round, name, key) or 0.0, 4)

    first = per_round[0][names[0]]  # where the children ran
    common = {k: first[k] for k in ("device", "platform")}
    common |= {"devices": int(first["device"].split(" x ")[0]), "processes": 1}
    common |= {"cores": os.cpu_count(), "global_batch_size": batch, "rounds": args.rounds}
    common |= {"window_s": cfg["seconds"], "build": args.src or "this"}
    for name in names:
        workload, entry = name.split(":", 1)
        line: dict[str, Any] = {**common, "workload": workload, "name": entry}
        images_per_s = batch * (median_of(per_round, name, "steps_per_s") or 0.0)
        line["images_per_s"] = round(images_per_s)
        if workload in ("place", "ceiling"):
            line["gb_per_s"] = round(images_per_s * np.prod(ROW) / 1e9, 3)
            line["loader_cpu_ms_per_step"] = median(name, "cpu_ms_per_step")
        if name == "place:meshfeed" and "place:device_put" in names:
            line["ratio_to_device_put"] = ratio(name, "place:device_put")
        if workload == "ceiling":
            line["workers"] = int(entry.split(":")[0])
            line["place_threads"] = entry.split(":t")[1] if ":t" in entry else "auto"
            if ":t" in entry:
                line["ratio_to_auto"] = ratio(name, f"ceiling:{line['workers']}")
            line["memcpy_ms"] = median(name, "memcpy_ms")
            per_memcpy = [r[name]["cpu_ms_per_step"] / r[name]["memcpy_ms"] for r in per_round]
            line["cpu_per_memcpy"] = round(statistics.median(per_memcpy), 4)
        if workload in ("decode", "vision"):
            workers = {"loops": cfg["loops"], "nvimgcodec": 0}
            line["workers"] = workers.get(entry, cfg["workers"])
            for peer in ("loops", "torch", "pillow"):
                if entry != peer and f"{workload}:{peer}" in names:
                    line[f"ratio_to_{peer}"] = ratio(name, f"{workload}:{peer}")
            if name == "vision:nvimgcodec":
                line["decoder"] = per_round[0][name]["decoder"]
        if name in ("model:fit", "model:fit-nvimgcodec"):
            line["input_wait_share"] = median(name, "input_wait")
            line["workers"] = cfg["workers"] if name == "model:fit" else 0
            if "model:synthetic" in names:
                line["ratio_to_synthetic"] = ratio(name, "model:synthetic")
        emit("gpu_host", smoke=args.smoke, **line)


if __name__ == "__main__":
    main()
