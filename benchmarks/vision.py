"""Workload I, images: a folder of ImageNet-size JPEGs to augmented batches, ``meshfeed.vision``.

A folder of JPEGs in class subfolders (500x375, quality 90, ~50-80 KB: an ImageNet
training image's size), read by ``ImageFolderSource``, each decoded, cut by
``RandomResizedCrop(224)`` (torchvision's rule), resized and flipped half the time, into
global batches of 64 on 8 CPU devices:

- ``loops x2``: two processes each reading the files and running the same Pillow decode,
  crop, resize and flip in a plain loop, nothing else: what the two cores give;
- ``meshfeed:2``: ``Loader(ImageFolderSource(root), record_transform=
  vision.RandomResizedCrop(224), num_workers=2)`` (goal: >= 0.85x ``loops x2``);
- ``meshfeed-nvimgcodec-cpu:2``: the same with ``decoder="nvimgcodec-cpu"``: each
  worker's chunk decoded at once by nvImageCodec's CPU codecs, each image in its crop
  only (the path a GPU host takes with ``"nvimgcodec-gpu"``);
- ``torch:2``: the PyTorch ``DataLoader(num_workers=2, pin_memory=True)`` over a
  map-style dataset that reads, decodes and augments the same way, numpy collate, then
  the global arrays.

``--augment trivial`` adds torchvision's ``TrivialAugmentWide`` after the crop and the
flip in every contender (meshfeed's ``augment=[vision.TrivialAugmentWide()]``; the
loops and the DataLoader's dataset make the same Pillow calls, which are torchvision's
PIL path without its dispatch). Goals: meshfeed >= 0.9x the loops, >= 1.2x the
DataLoader.

Rounds rotate the order; the lines report the median over rounds of images/s and of each
entry's ratio to ``loops x2`` in its round. ``--smoke`` for CI.
"""

from __future__ import annotations

import os

os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import argparse
import importlib.util
import io
import json
import shutil
import statistics
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

import meshfeed
import meshfeed.vision as vision

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import loops_at_once, measure, to_global

BATCH, SIZE = 64, 224


def write_folder(
    root: Path, n: int, height: int = 375, width: int = 500, noise: float = 18.0
) -> Path:
    """``n`` JPEGs in 4 class folders: smooth gradients with detail and noise (~97 KB at
    the default ``noise``, ~69 KB at 10: cheaper decodes)."""
    rng = np.random.default_rng(0)
    y, x = np.mgrid[0:height, 0:width]
    for i in range(n):
        folder = root / f"class_{i % 4}"
        folder.mkdir(parents=True, exist_ok=True)
        phase = rng.uniform(0, 6.28, 3)
        base = np.stack(
            [127 + 100 * np.sin(x / (17 + 5 * k) + phase[k] + y / 31) for k in range(3)], -1
        )
        pixels = np.clip(base + rng.normal(0, noise, (height, width, 3)), 0, 255).astype(np.uint8)
        buffer = io.BytesIO()
        Image.fromarray(pixels).save(buffer, "JPEG", quality=90)
        (folder / f"{i:06d}.jpg").write_bytes(buffer.getvalue())
    return root


_LOOP = """
import io, sys, time
sys.path.insert(0, {here!r})
import numpy as np
from PIL import Image
import meshfeed.vision as vision
paths = {paths!r}
print("ready", flush=True)
sys.stdin.readline()
rng = np.random.default_rng(0)
done, start = 0, time.perf_counter()
while time.perf_counter() - start < {seconds}:
    for path in paths:
        with open(path, "rb") as f:
            data = f.read()
        with Image.open(io.BytesIO(data)) as im:
            top, left, h, w = vision.random_resized_crop(im.height, im.width, rng)
            flip = rng.random() < 0.5
            crop = im.convert("RGB").crop((left, top, left + w, top + h))
        resized = crop.resize(({size}, {size}), Image.BILINEAR)
        if {augment}:
            if flip:
                resized = resized.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
            trivial = vision.TrivialAugmentWide()
            pixels = np.asarray(trivial.apply(resized, trivial.params({size}, {size}, rng)))
        else:
            pixels = np.asarray(resized)
            if flip:
                pixels = np.ascontiguousarray(pixels[:, ::-1])
    done += len(paths)
print(done / (time.perf_counter() - start), flush=True)
"""


def _crop(decoder: str = "pillow") -> vision.RandomResizedCrop:
    """The crop every contender runs, with TrivialAugmentWide after it under --augment."""
    augment = [vision.TrivialAugmentWide()] if AUGMENT else []
    return vision.RandomResizedCrop(SIZE, decoder=decoder, augment=augment)  # type: ignore[arg-type]


AUGMENT = False  # --augment trivial


def _meshfeed(root: Path, workers: int, decoder: str) -> Callable[[], Iterator[Any]]:
    sharding = meshfeed.batch_sharding(meshfeed.make_mesh(data=8))
    source = meshfeed.ImageFolderSource(root)

    def run() -> Iterator[Any]:
        loader = meshfeed.Loader(
            source, global_batch_size=BATCH, sharding=sharding, num_epochs=None,
            record_transform=_crop(decoder),
            num_workers=workers,
        )  # fmt: skip
        try:
            yield from loader
        finally:
            loader.close()

    return run


class _TorchImages:
    """A map-style dataset: a file read, decoded and augmented as the loop does it."""

    def __init__(self, paths: list[str], labels: np.ndarray) -> None:
        self.paths, self.labels = paths, labels
        self.crop = _crop()

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int) -> dict[str, np.ndarray]:
        with open(self.paths[i], "rb") as f:
            data = np.frombuffer(f.read(), np.uint8)
        record = {"image": data, "label": self.labels[i]}
        return self.crop(record, np.random.default_rng(i))


def _collate(records: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    return {k: np.stack([r[k] for r in records]) for k in records[0]}


def _torch(root: Path, workers: int) -> Callable[[], Iterator[Any]] | str:
    if importlib.util.find_spec("torch") is None:
        return "torch is not installed"
    import torch.utils.data

    source = meshfeed.ImageFolderSource(root)
    dataset = _TorchImages([source.path(i) for i in range(len(source))],
                           source[np.arange(len(source))]["label"])  # fmt: skip

    def run() -> Iterator[Any]:
        loader = torch.utils.data.DataLoader(
            dataset, batch_size=BATCH, shuffle=True, num_workers=workers, collate_fn=_collate,
            drop_last=True, persistent_workers=True, prefetch_factor=4, pin_memory=True,
        )  # fmt: skip
        while True:
            yield from to_global(iter(loader), BATCH)

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="64 images, one short round")
    parser.add_argument("--images", type=int, default=512)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument(
        "--noise", type=float, default=18.0, help="the images' noise: 18 ~97 KB, 10 ~69 KB"
    )
    parser.add_argument(
        "--augment", choices=["none", "trivial"], default="none",
        help="trivial: TrivialAugmentWide after the crop and flip, in every contender",
    )  # fmt: skip
    args = parser.parse_args()
    global AUGMENT
    AUGMENT = args.augment == "trivial"
    images, rounds, seconds = (
        (64, 1, 0.3) if args.smoke else (args.images, args.rounds, args.seconds)
    )
    scratch = Path(tempfile.mkdtemp(prefix="meshfeed-vision-"))
    try:
        root = write_folder(scratch / "train", images, noise=args.noise)
        source = meshfeed.ImageFolderSource(root)
        paths = [source.path(i) for i in range(len(source))]
        kb = statistics.mean(os.path.getsize(p) for p in paths) / 1e3
        loop = _LOOP.format(here=str(Path(__file__).parent), paths=paths, seconds=seconds,
                            size=SIZE, augment=AUGMENT)  # fmt: skip
        entries: dict[str, Callable[[], Iterator[Any]] | str] = {
            "meshfeed:2": _meshfeed(root, 2, "pillow"),
            "torch:2": _torch(root, 2),
        }
        if importlib.util.find_spec("nvidia.nvimgcodec") is not None:
            entries["meshfeed-nvimgcodec-cpu:2"] = _meshfeed(root, 2, "nvimgcodec-cpu")
        names = ["loops x2", *entries]
        got: dict[str, list[float]] = {n: [] for n in names}
        ratios: dict[str, list[float]] = {n: [] for n in names}
        for r in range(rounds):
            here: dict[str, float] = {}
            for name in names[r % len(names) :] + names[: r % len(names)]:
                run = entries.get(name)
                if name == "loops x2":
                    here[name] = loops_at_once(loop, 2)
                elif callable(run):
                    here[name] = measure(run, BATCH, seconds, warmup=2)
            for name, rate in here.items():
                got[name].append(rate)
                ratios[name].append(rate / here["loops x2"])
        for name in names:
            line: dict[str, Any] = {
                "benchmark": "vision", "workload": "I", "entry": name, "images": images,
                "kb": round(kb, 1), "rounds": rounds, "smoke": args.smoke,
                "augment": args.augment,
            }  # fmt: skip
            if isinstance(entries.get(name), str):
                line["skipped"] = entries[name]
            else:
                line["images_per_s"] = round(statistics.median(got[name]), 1)
                line["over_loops_x2"] = round(statistics.median(ratios[name]), 3)
            print(json.dumps(line), flush=True)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
