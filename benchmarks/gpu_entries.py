"""What ``gpu_host.py`` runs in its child processes: each entry's workload, timed."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from gpu_fns import LOOP, ROW, copy_row, decode_crop_flip, decode_index, load_jpegs

import meshfeed
from common import loops_at_once, torch_batches

HERE = Path(__file__).resolve().parent


def _timed(batches: Iterator[Any], seconds: float, warmup: int = 5) -> dict[str, float]:
    """Steps a second over ``seconds`` of steady state, and this process's CPU a step."""
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
    src = np.ones((batch, *ROW), np.uint8)
    dst = np.empty_like(src)
    best = float("inf")
    for _ in range(20):
        began = time.perf_counter()
        np.copyto(dst, src)
        best = min(best, time.perf_counter() - began)
    return 1e3 * best


def _rows(n: int) -> Any:
    rng = np.random.default_rng(0)
    return {
        "image": rng.integers(0, 256, (n, *ROW), np.uint8),
        "label": np.arange(n, dtype=np.int32),
    }


def _sharding() -> Any:
    return meshfeed.batch_sharding(meshfeed.make_mesh(data=jax.device_count()))


def _loader(source: dict[str, Any], batch: int, **options: Any) -> Any:
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
    jpegs = load_jpegs(cfg[file])
    column = np.empty(len(jpegs), object)
    column[:] = jpegs
    return {field: column, "label": np.arange(len(jpegs), dtype=np.int32) % 1000}


def _decode_meshfeed(cfg: dict[str, Any]) -> dict[str, float]:
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
        return decode_index(self.data["jpeg"][i], int(self.data["label"][i]), i)


def _decode_torch(cfg: dict[str, Any]) -> dict[str, float]:
    run = torch_batches(_Images(_jpegs(cfg)), cfg["batch"], workers=cfg["workers"])
    assert not isinstance(run, str), run  # the parent runs it only where torch is
    return _timed(run(), cfg["seconds"])


def _loops(cfg: dict[str, Any], work: str, file: str) -> dict[str, float]:
    """``L`` plain loops of ``work`` at once over the JPEGs of ``cfg[file]``."""
    script = LOOP.format(
        here=str(HERE), work=work, source=cfg[file], seconds=cfg["seconds"], augment=False
    )
    return {"steps_per_s": loops_at_once(script, cfg["loops"]) / cfg["batch"]}


def _crop(decoder: str) -> Any:
    import meshfeed.vision  # here: a build before (``--src``) may not have it

    return meshfeed.vision.RandomResizedCrop(224, decoder=decoder)  # type: ignore[arg-type]


def _vision(cfg: dict[str, Any], decoder: str) -> dict[str, float]:
    """``vision:pillow`` (``W`` workers) or ``vision:nvimgcodec`` (the loading process)."""
    workers = cfg["workers"] if decoder == "pillow" else 0
    images = _jpegs(cfg, "vision_file", "image")
    loader = _loader(images, cfg["batch"], record_transform=_crop(decoder), num_workers=workers)
    try:
        got = _timed(iter(loader), cfg["seconds"])
        got["decoder"] = loader.stats()["record_transform"].get("decoder", decoder)
        return got
    finally:
        loader.close()


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
    params, loss = _model(cfg["model"])
    if decoder is None:  # 256x256 JPEGs decoded and cropped in the workers
        loader = _loader(
            _jpegs(cfg), cfg["batch"], record_transform=decode_crop_flip, num_workers=cfg["workers"]
        )
    else:  # ImageNet-size JPEGs through meshfeed.vision's decoder, in the loading process
        loader = _loader(
            _jpegs(cfg, "vision_file", "image"), cfg["batch"], record_transform=_crop(decoder)
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


def run_entries(names: str, cfg: dict[str, Any]) -> None:
    """Runs the entries ``names`` (comma-separated: several in --smoke only) in this
    process, one after another, each printing its figures as a JSON line."""

    runs: dict[str, Callable[[], dict[str, float]]] = {
        "place:meshfeed": lambda: _place_meshfeed(cfg),
        "place:device_put": lambda: _place_device_put(cfg),
        "decode:meshfeed": lambda: _decode_meshfeed(cfg),
        "decode:torch": lambda: _decode_torch(cfg),
        "decode:loops": lambda: _loops(cfg, "crop_flip", "jpeg_file"),
        "model:synthetic": lambda: _train(cfg, fed=False),
        "model:fit": lambda: _train(cfg, fed=True),
        "model:fit-nvimgcodec": lambda: _train(cfg, fed=True, decoder=cfg["decoder"]),
        "vision:pillow": lambda: _vision(cfg, "pillow"),
        "vision:nvimgcodec": lambda: _vision(cfg, cfg["decoder"]),
        "vision:loops": lambda: _loops(cfg, "resized_crop", "vision_file"),
    }
    for workers in cfg["ceiling"]:
        runs[f"ceiling:{workers}"] = lambda workers=workers: _ceiling(cfg, workers)
    first = cfg["ceiling"][0]
    for threads in cfg["place_threads"]:
        runs[f"ceiling:{first}:t{threads}"] = lambda t=threads: _ceiling(cfg, first, t)
    device = jax.devices()[0]
    for one in names.split(","):
        got: dict[str, Any] = runs[one]()
        got.update(device=f"{jax.device_count()} x {device.device_kind}", platform=device.platform)
        print(json.dumps(got), flush=True)
