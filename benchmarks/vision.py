"""Workload I, images: a folder of ImageNet-size JPEGs to augmented batches, ``meshfeed.vision``.

JPEGs of 500x375 in class folders read by ``ImageFolderSource``, cut by
``vision.RandomResizedCrop(224)`` (torchvision's rule), resized and flipped, into global
batches of 64 on 8 CPU devices. ``meshfeed:2`` (2 workers; goal >= 0.85x the loops) and
``meshfeed-nvimgcodec-cpu:2`` against ``loops x2`` (two processes running the same Pillow
work in a plain loop: what the two cores give) and ``torch:2`` (the DataLoader with 2
workers and pinned memory). ``--augment trivial`` adds TrivialAugmentWide in every
contender (goals: >= 0.9x the loops, >= 1.2x the DataLoader). Rotating rounds; the
medians of images/s and of the per-round ratios to the loops. ``--smoke`` for CI.
"""

from __future__ import annotations

import importlib.util
import io
import os
import shutil
import statistics
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
from gpu_fns import LOOP
from harness import arguments, emit, in_rounds, median_of, median_ratio, use_cpu_devices
from PIL import Image

import meshfeed
import meshfeed.vision as vision
from common import loader_batches, loops_at_once, measure, torch_batches

HERE = Path(__file__).resolve().parent
BATCH, SIZE = 64, 224
LOOPS = "loops x2"


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


def _crop(augment: bool, decoder: str = "pillow") -> vision.RandomResizedCrop:
    """The crop every contender runs, with TrivialAugmentWide after it under --augment."""
    after = [vision.TrivialAugmentWide()] if augment else []
    return vision.RandomResizedCrop(SIZE, decoder=decoder, augment=after)  # type: ignore[arg-type]


class _TorchImages:
    """A map-style dataset: a file read, decoded and augmented as the loop does it."""

    def __init__(self, paths: list[str], labels: np.ndarray, augment: bool) -> None:
        self.paths, self.labels = paths, labels
        self.crop = _crop(augment)

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int) -> dict[str, np.ndarray]:
        with open(self.paths[i], "rb") as f:
            data = np.frombuffer(f.read(), np.uint8)
        record = {"image": data, "label": self.labels[i]}
        return self.crop(record, np.random.default_rng(i))


def _torch(root: Path, workers: int, augment: bool) -> Callable[[], Iterator[Any]] | str:
    source = meshfeed.ImageFolderSource(root)
    paths = [source.path(i) for i in range(len(source))]
    dataset = _TorchImages(paths, source[np.arange(len(source))]["label"], augment)
    return torch_batches(dataset, BATCH, workers=workers, prefetch_factor=4, pin_memory=True)


def _meshfeed(root: Path, workers: int, decoder: str, augment: bool) -> Callable[[], Any]:
    source = meshfeed.ImageFolderSource(root)
    crop = _crop(augment, decoder)
    return loader_batches(lambda: source, BATCH, record_transform=crop, num_workers=workers)


def _timed(run: Callable[[], Iterator[Any]], seconds: float) -> Callable[[], float]:
    return lambda: measure(run, BATCH, seconds, warmup=2)


def _flags(parser: Any) -> None:
    parser.add_argument("--images", type=int, default=512)
    parser.add_argument(
        "--noise", type=float, default=18.0, help="the images' noise: 18 ~97 KB, 10 ~69 KB"
    )
    parser.add_argument(
        "--augment",
        choices=["none", "trivial"],
        default="none",
        help="trivial: TrivialAugmentWide after the crop and flip, in every contender",
    )


def main() -> None:
    use_cpu_devices()
    smoke = {"images": 64, "rounds": 1, "seconds": 0.3}
    args = arguments(__doc__, seconds=3.0, rounds=5, smoke=smoke, add=_flags)
    augment = args.augment == "trivial"
    scratch = Path(tempfile.mkdtemp(prefix="meshfeed-vision-"))
    try:
        root = write_folder(scratch / "train", args.images, noise=args.noise)
        source = meshfeed.ImageFolderSource(root)
        paths = [source.path(i) for i in range(len(source))]
        kb = statistics.mean(os.path.getsize(p) for p in paths) / 1e3
        loop = LOOP.format(
            here=str(HERE), work="resized_crop", source=paths, seconds=args.seconds, augment=augment
        )
        peers: dict[str, Callable[[], Iterator[Any]] | str] = {
            "meshfeed:2": _meshfeed(root, 2, "pillow", augment),
            "torch:2": _torch(root, 2, augment),
        }
        if importlib.util.find_spec("nvidia.nvimgcodec") is not None:
            peers["meshfeed-nvimgcodec-cpu:2"] = _meshfeed(root, 2, "nvimgcodec-cpu", augment)
        entries: dict[str, Callable[[], float] | str] = {LOOPS: lambda: loops_at_once(loop, 2)}
        for name, run in peers.items():
            entries[name] = run if isinstance(run, str) else _timed(run, args.seconds)
        per_round = in_rounds(entries, args.rounds)
        common = {"images": args.images, "kb": round(kb, 1), "rounds": args.rounds}
        for name, entry in entries.items():
            if isinstance(entry, str):
                figures: dict[str, Any] = {"skipped": entry}
            else:
                images_per_s = round(median_of(per_round, name) or 0.0, 1)
                over_loops = median_ratio(per_round, name, LOOPS)
                figures = {"images_per_s": images_per_s, "over_loops_x2": over_loops}
            line = {"workload": "I", "entry": name, **common, "augment": args.augment, **figures}
            emit("vision", smoke=args.smoke, **line)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
