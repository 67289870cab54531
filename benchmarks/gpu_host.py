"""A GPU host at the speed of its cores: what the loading process costs, what a host feeds.

ImageNet-size rows (224x224x3 uint8) into global ``jax.Array`` batches on every device
of the host, sharded by the batch. Each contender runs in a fresh process, once per
round, the order rotating from round to round; every figure is the median over rounds,
every ratio the median of the per-round ratios (a window of at least 0.3 s each).

- ``place``: rows in memory, shuffled, onto the devices, no workers. ``meshfeed``: a
  ``Loader``; ``device_put``: ``jax.device_put`` of batches gathered beforehand (the
  same shape and sharding), the most a loader can hope for. GB/s.
- ``ceiling``: the same rows through ``W`` record workers whose transform copies the
  row: the pipeline's own cost. Images/s, and the loading process's CPU a step (every
  thread of it, ``time.process_time``) against one memcpy of the batch into a reused
  buffer timed in the same process (``cpu_per_memcpy``).
- ``decode``: JPEG 256x256 -> random 224 crop + flip. ``meshfeed:W`` (``W`` worker
  processes) vs ``loops:L`` (``L`` processes running the plain decode loop at once, one
  per core: what the cores give) vs ``torch:W`` (the PyTorch ``DataLoader`` with ``W``
  workers, numpy collate, then ``make_array_from_process_local_data``). Images/s.
- ``model``: a small convnet. ``synthetic``: its train step on a batch already on the
  devices; ``fit``: ``meshfeed.fit`` fed by ``decode:meshfeed:W``; ``fit-nvimgcodec``:
  fed by ``vision:nvimgcodec``. Images/s, input wait.
- ``vision``: ImageNet-size JPEGs (375x500) through ``meshfeed.vision.RandomResizedCrop
  (224)`` (torchvision's crop, resize and flip). ``pillow``: decoded by Pillow in ``W``
  worker processes; ``nvimgcodec``: by nvImageCodec in the loading process, a step's
  rows at a time, each image in its crop only -- on the GPU's JPEG engines with
  ``--platform gpu`` (goal: >= 2x the loops), its CPU codecs otherwise; ``loops``: ``L``
  plain loops of the same Pillow work at once. Images/s.

``--platform cpu`` (the default) runs on 8 simulated CPU devices (batch 64: the figures
of this 2-core machine; its decode is CPU-bound long before any funnel); ``--platform
gpu`` on the host's GPUs (batch 256, 15 decode workers, 16 loops), run through the
device tool when a session is lent one. Prints one JSON line per entry, with the device
and the core count; ``--smoke`` for CI (tiny sizes, every entry once, all in one child
process).
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROW = (224, 224, 3)
ROW_BYTES = 224 * 224 * 3

SIZES = {  # batch, rows in memory, JPEGs, ceiling workers, decode workers, loops, window
    "cpu": {
        "batch": 64,
        "rows": 512,
        "jpegs": 512,
        "ceiling": [1, 2],
        "place_threads": [1, 2],
        "workers": 2,
        "loops": 2,
        "seconds": 2.0,
        "model": "tiny",
        "vision_jpegs": 256,
        "decoder": "nvimgcodec-cpu",
    },
    "gpu": {
        "batch": 256,
        "rows": 2048,
        "jpegs": 2048,
        "ceiling": [15, 2],
        "place_threads": [0, 2, 4, 8],
        "workers": 15,
        "loops": 16,
        "seconds": 3.0,
        "model": "convnet",
        "vision_jpegs": 1024,
        "decoder": "nvimgcodec-gpu",
    },
    "smoke": {
        "batch": 16,
        "rows": 64,
        "jpegs": 48,
        "ceiling": [1],
        "place_threads": [2],
        "workers": 1,
        "loops": 1,
        "seconds": 0.3,
        "model": "tiny",
        "vision_jpegs": 32,
        "decoder": "nvimgcodec-cpu",
    },
}


# ----------------------------------------------------------------------------- children


def _env(platform_name: str) -> dict[str, str]:
    env = dict(os.environ)
    if platform_name == "cpu":
        flags = [f for f in env.get("XLA_FLAGS", "").split() if "device_count" not in f]
        env["XLA_FLAGS"] = " ".join([*flags, "--xla_force_host_platform_device_count=8"])
        env["JAX_PLATFORMS"] = "cpu"
    return env


def _timed(batches: Iterator[Any], seconds: float, warmup: int = 5) -> dict[str, float]:
    """Steps a second over ``seconds`` of steady state, and this process's CPU a step."""
    import jax

    for _ in range(warmup):
        jax.block_until_ready(next(batches))
    steps, cpu, start = 0, time.process_time(), time.perf_counter()
    while True:
        jax.block_until_ready(next(batches))
        steps += 1
        elapsed = time.perf_counter() - start
        if elapsed >= seconds and steps >= 3:
            break
    cpu_ms = 1e3 * (time.process_time() - cpu) / steps
    return {"steps_per_s": steps / elapsed, "cpu_ms_per_step": cpu_ms}


def _memcpy_ms(batch: int) -> float:
    """One memcpy of a batch of rows into a reused buffer (best of 20), milliseconds."""
    import numpy as np

    src = np.ones((batch, *ROW), np.uint8)
    dst = np.empty_like(src)
    best = float("inf")
    for _ in range(20):
        began = time.perf_counter()
        np.copyto(dst, src)
        best = min(best, time.perf_counter() - began)
    return 1e3 * best


def _rows(n: int) -> Any:
    import numpy as np

    rng = np.random.default_rng(0)
    return {
        "image": rng.integers(0, 256, (n, *ROW), np.uint8),
        "label": np.arange(n, dtype=np.int32),
    }


def _sharding() -> Any:
    import jax

    import meshfeed

    return meshfeed.batch_sharding(meshfeed.make_mesh(data=jax.device_count()))


def _loader(source: dict[str, Any], batch: int, **options: Any) -> Any:
    import meshfeed

    return meshfeed.Loader(
        meshfeed.ArraySource(source),
        global_batch_size=batch,
        sharding=_sharding(),
        num_epochs=None,
        **options,
    )


def _place_meshfeed(cfg: dict[str, Any]) -> dict[str, float]:
    loader = _loader(_rows(cfg["rows"]), cfg["batch"])
    return _timed(iter(loader), cfg["seconds"])


def _place_device_put(cfg: dict[str, Any]) -> dict[str, float]:
    import jax
    import numpy as np

    rows, sharding, rng = _rows(cfg["rows"]), _sharding(), np.random.default_rng(1)
    ready = []
    for _ in range(8):
        ids = rng.choice(cfg["rows"], cfg["batch"], replace=False)
        ready.append({k: v[ids] for k, v in rows.items()})

    def batches() -> Iterator[Any]:
        while True:
            for b in ready:
                yield {k: jax.device_put(v, sharding) for k, v in b.items()}

    return _timed(batches(), cfg["seconds"])


def _ceiling(cfg: dict[str, Any], workers: int, threads: int | None = None) -> dict[str, float]:
    from gpu_fns import copy_row

    options: dict[str, Any] = {} if threads is None else {"place_threads": threads}
    loader = _loader(
        _rows(cfg["rows"]), cfg["batch"], record_transform=copy_row, num_workers=workers, **options
    )
    try:
        got = _timed(iter(loader), cfg["seconds"])
    finally:
        loader.close()
    got["memcpy_ms"] = _memcpy_ms(cfg["batch"])
    return got


def _jpegs(cfg: dict[str, Any], file: str = "jpeg_file", field: str = "jpeg") -> dict[str, Any]:
    """The JPEGs of ``cfg[file]`` as a source's columns: ``field`` (bytes) and a label."""
    import numpy as np

    with open(cfg[file], "rb") as f:
        jpegs = pickle.load(f)
    column = np.empty(len(jpegs), object)
    column[:] = jpegs
    return {field: column, "label": np.arange(len(jpegs), dtype=np.int32) % 1000}


def _decode_meshfeed(cfg: dict[str, Any]) -> dict[str, float]:
    from gpu_fns import decode_crop_flip

    loader = _loader(
        _jpegs(cfg), cfg["batch"], record_transform=decode_crop_flip, num_workers=cfg["workers"]
    )
    try:
        return _timed(iter(loader), cfg["seconds"])
    finally:
        loader.close()


class _Images:
    """A map-style dataset for the DataLoader (decodes in its workers)."""

    def __init__(self, data: dict[str, Any]) -> None:
        self.data = data

    def __len__(self) -> int:
        return len(self.data["label"])

    def __getitem__(self, i: int) -> dict[str, Any]:
        from gpu_fns import decode_index

        return decode_index(self.data["jpeg"][i], int(self.data["label"][i]), i)


def _collate(records: list[dict[str, Any]]) -> dict[str, Any]:
    import numpy as np

    return {k: np.stack([r[k] for r in records]) for k in records[0]}


def _decode_torch(cfg: dict[str, Any]) -> dict[str, float]:
    import torch
    from torch.utils.data import DataLoader

    from common import to_global

    loader = DataLoader(
        _Images(_jpegs(cfg)),
        batch_size=cfg["batch"],
        shuffle=True,
        drop_last=True,  # type: ignore[arg-type]
        collate_fn=_collate,
        num_workers=cfg["workers"],
        persistent_workers=True,
        generator=torch.Generator().manual_seed(0),
    )

    def batches() -> Iterator[Any]:
        while True:
            yield from to_global(iter(loader), cfg["batch"])

    return _timed(batches(), cfg["seconds"])


_LOOP = """
import pickle, sys, time
sys.path.insert(0, {here!r})
import numpy as np
from gpu_fns import decode_crop_flip
jpegs = pickle.load(open({file!r}, "rb"))
print("ready", flush=True)
sys.stdin.readline()
rng, done, start = np.random.default_rng(0), 0, time.perf_counter()
while time.perf_counter() - start < {seconds}:
    for i, jpeg in enumerate(jpegs):
        decode_crop_flip({{"jpeg": jpeg, "label": i}}, rng)
    done += len(jpegs)
print(done / (time.perf_counter() - start), flush=True)
"""


def _decode_loops(cfg: dict[str, Any]) -> dict[str, float]:
    from common import loops_at_once

    script = _LOOP.format(here=str(HERE), file=cfg["jpeg_file"], seconds=cfg["seconds"])
    return {"steps_per_s": loops_at_once(script, cfg["loops"]) / cfg["batch"]}


def _crop(cfg: dict[str, Any], decoder: str) -> Any:
    import meshfeed.vision

    return meshfeed.vision.RandomResizedCrop(224, decoder=decoder)  # type: ignore[arg-type]


def _vision(cfg: dict[str, Any], decoder: str) -> dict[str, float]:
    """``vision:pillow`` (``W`` workers) or ``vision:nvimgcodec`` (the loading process)."""
    workers = cfg["workers"] if decoder == "pillow" else 0
    crop = _crop(cfg, decoder)
    loader = _loader(
        _jpegs(cfg, "vision_file", "image"),
        cfg["batch"],
        record_transform=crop,
        num_workers=workers,
    )
    try:
        got = _timed(iter(loader), cfg["seconds"])
        got["decoder"] = loader.stats()["record_transform"].get("decoder", decoder)
        return got
    finally:
        loader.close()


_VISION_LOOP = """
import io, pickle, sys, time
import numpy as np
from PIL import Image
import meshfeed.vision as vision
jpegs = pickle.load(open({file!r}, "rb"))
print("ready", flush=True)
sys.stdin.readline()
rng, done, start = np.random.default_rng(0), 0, time.perf_counter()
while time.perf_counter() - start < {seconds}:
    for jpeg in jpegs:
        with Image.open(io.BytesIO(jpeg)) as im:
            top, left, h, w = vision.random_resized_crop(im.height, im.width, rng)
            flip = rng.random() < 0.5
            crop = im.convert("RGB").crop((left, top, left + w, top + h))
        pixels = np.asarray(crop.resize((224, 224), Image.BILINEAR))
        if flip:
            pixels = np.ascontiguousarray(pixels[:, ::-1])
    done += len(jpegs)
print(done / (time.perf_counter() - start), flush=True)
"""


def _vision_loops(cfg: dict[str, Any]) -> dict[str, float]:
    from common import loops_at_once

    script = _VISION_LOOP.format(file=cfg["vision_file"], seconds=cfg["seconds"])
    return {"steps_per_s": loops_at_once(script, cfg["loops"]) / cfg["batch"]}


def _model(kind: str) -> tuple[Any, Callable[..., Any]]:
    """Parameters and loss of a small convnet on 224x224x3 uint8 images, 1000 classes."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    import optax

    import meshfeed

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
        for i, s in enumerate(convs):
            w = p[f"conv{i}"].astype(x.dtype)
            x = jax.nn.relu(
                jax.lax.conv_general_dilated(
                    x, w, (s[4], s[4]), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC")
                )
            )
        logits = x.mean(axis=(1, 2)).astype(jnp.float32) @ p["dense"]
        losses = optax.softmax_cross_entropy_with_integer_labels(logits, batch["label"])
        return meshfeed.masked_mean(losses, batch), {}

    return params, loss


def _train(cfg: dict[str, Any], fed: bool, decoder: str | None = None) -> dict[str, float]:
    import jax
    import optax
    from gpu_fns import decode_crop_flip

    import meshfeed

    params, loss = _model(cfg["model"])
    if decoder is None:  # 256x256 JPEGs decoded and cropped in the workers
        loader = _loader(
            _jpegs(cfg), cfg["batch"], record_transform=decode_crop_flip, num_workers=cfg["workers"]
        )
    else:  # ImageNet-size JPEGs through meshfeed.vision's decoder, in the loading process
        loader = _loader(
            _jpegs(cfg, "vision_file", "image"), cfg["batch"], record_transform=_crop(cfg, decoder)
        )
    mesh = _sharding().mesh
    optimizer = optax.sgd(1e-3)
    state = meshfeed.TrainState.create(params, optimizer, mesh=mesh)
    step = meshfeed.make_train_step(loss, optimizer, mesh=mesh)
    first = loader.batch(0)
    state, _ = step(state, first)  # compiled outside the timed part
    jax.block_until_ready(state)
    try:
        if not fed:

            def batches() -> Iterator[Any]:
                nonlocal state
                while True:
                    state, _ = step(state, first)
                    yield state

            return _timed(batches(), cfg["seconds"], warmup=2)
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
    finally:
        loader.close()


def _child(name: str, cfg: dict[str, Any]) -> None:
    sys.path.insert(0, str(HERE))
    import jax

    runs: dict[str, Callable[[], dict[str, float]]] = {
        "place:meshfeed": lambda: _place_meshfeed(cfg),
        "place:device_put": lambda: _place_device_put(cfg),
        "decode:meshfeed": lambda: _decode_meshfeed(cfg),
        "decode:torch": lambda: _decode_torch(cfg),
        "decode:loops": lambda: _decode_loops(cfg),
        "model:synthetic": lambda: _train(cfg, fed=False),
        "model:fit": lambda: _train(cfg, fed=True),
        "model:fit-nvimgcodec": lambda: _train(cfg, fed=True, decoder=cfg["decoder"]),
        "vision:pillow": lambda: _vision(cfg, "pillow"),
        "vision:nvimgcodec": lambda: _vision(cfg, cfg["decoder"]),
        "vision:loops": lambda: _vision_loops(cfg),
    }
    for workers in cfg["ceiling"]:
        runs[f"ceiling:{workers}"] = lambda workers=workers: _ceiling(cfg, workers)
    first = cfg["ceiling"][0]
    for threads in cfg["place_threads"]:
        runs[f"ceiling:{first}:t{threads}"] = lambda t=threads: _ceiling(cfg, first, t)
    device = jax.devices()[0]
    for one in name.split(","):  # several in one process in --smoke only
        got = runs[one]()
        got.update(device=f"{jax.device_count()} x {device.device_kind}", platform=device.platform)
        print(json.dumps(got), flush=True)


# ------------------------------------------------------------------------------- parent


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="tiny data and timings, for CI")
    parser.add_argument("--platform", choices=["cpu", "gpu"], default="cpu")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--only", default="", help="comma-separated workloads or entries (place, ceiling:1)"
    )
    parser.add_argument(
        "--src", default="", help="a meshfeed checkout's src/ to time instead (a build before)"
    )
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--config", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        with open(args.config) as f:
            _child(args.child, json.load(f))
        return
    cfg = dict(SIZES["smoke" if args.smoke else args.platform])
    rounds = 1 if args.smoke else args.rounds
    env = _env(args.platform)
    if args.src:  # the children import that meshfeed (the benchmark's helpers stay these)
        env["PYTHONPATH"] = os.pathsep.join([args.src, env.get("PYTHONPATH", "")]).strip(os.pathsep)
    sys.path.insert(0, str(HERE))
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
    try:
        import torch  # noqa: F401

        has_torch = True
    except ImportError:
        has_torch = False
    from importlib.util import find_spec

    nvimgcodec = find_spec("nvidia") is not None and find_spec("nvidia.nvimgcodec") is not None
    names = _names(cfg, has_torch, nvimgcodec)
    if args.only:
        wanted = set(args.only.split(","))
        names = [n for n in names if n in wanted or n.split(":")[0] in wanted]
    per_round: list[dict[str, dict[str, Any]]] = []
    for r in range(rounds):
        if args.smoke:  # one process for all: the smoke checks that each runs
            per_round.append(_run_children(names, cfg_file, env))
            continue
        got = {}
        for name in names[r % len(names) :] + names[: r % len(names)]:
            got[name] = _run_child(name, cfg_file, env)
        per_round.append(got)
    _report(per_round, names, cfg, args, rounds)


def _report(
    per_round: list[dict[str, dict[str, Any]]],
    names: list[str],
    cfg: dict[str, Any],
    args: argparse.Namespace,
    rounds: int,
) -> None:
    batch = cfg["batch"]

    def median(fn: Callable[[dict[str, dict[str, Any]]], float]) -> float:
        return round(statistics.median(fn(r) for r in per_round), 4)

    def rate(r: dict[str, dict[str, Any]], name: str) -> float:
        return r[name]["steps_per_s"] * batch

    first = per_round[0][names[0]]
    common = {
        "benchmark": "gpu_host",
        "device": first["device"],
        "platform": first["platform"],
        "cores": os.cpu_count(),
        "global_batch_size": batch,
        "rounds": rounds,
        "window_s": cfg["seconds"],
        "build": args.src or "this",
        "smoke": args.smoke,
        "python": platform.python_version(),
    }
    for name in names:
        workload, entry = name.split(":", 1)
        line: dict[str, Any] = {**common, "workload": workload, "name": entry}
        line["images_per_s"] = round(median(lambda r, n=name: rate(r, n)))
        if workload in ("place", "ceiling"):
            line["gb_per_s"] = round(median(lambda r, n=name: rate(r, n) * ROW_BYTES / 1e9), 3)
            line["loader_cpu_ms_per_step"] = median(lambda r, n=name: r[n]["cpu_ms_per_step"])
        if name == "place:meshfeed" and "place:device_put" in names:
            line["ratio_to_device_put"] = median(
                lambda r: rate(r, "place:meshfeed") / rate(r, "place:device_put")
            )
        if workload == "ceiling":
            line["workers"] = int(entry.split(":")[0])
            line["place_threads"] = entry.split(":t")[1] if ":t" in entry else "auto"
            if ":t" in entry:
                auto = f"ceiling:{line['workers']}"
                line["ratio_to_auto"] = median(lambda r, n=name, a=auto: rate(r, n) / rate(r, a))
            line["memcpy_ms"] = median(lambda r, n=name: r[n]["memcpy_ms"])
            line["cpu_per_memcpy"] = median(
                lambda r, n=name: r[n]["cpu_ms_per_step"] / r[n]["memcpy_ms"]
            )
        if workload in ("decode", "vision"):
            workers = {"loops": cfg["loops"], "nvimgcodec": 0}
            line["workers"] = workers.get(entry, cfg["workers"])
            for peer in ("loops", "torch", "pillow"):
                if entry != peer and f"{workload}:{peer}" in names:
                    line[f"ratio_to_{peer}"] = median(
                        lambda r, n=name, p=f"{workload}:{peer}": rate(r, n) / rate(r, p)
                    )
            if name == "vision:nvimgcodec":
                line["decoder"] = per_round[0][name]["decoder"]
        if name in ("model:fit", "model:fit-nvimgcodec"):
            line["input_wait_share"] = median(lambda r, n=name: r[n]["input_wait"])
            line["workers"] = cfg["workers"] if name == "model:fit" else 0
            if "model:synthetic" in names:
                line["ratio_to_synthetic"] = median(
                    lambda r, n=name: rate(r, n) / rate(r, "model:synthetic")
                )
        print(json.dumps(line), flush=True)


if __name__ == "__main__":
    main()
