"""Workload I, images: a folder of ImageNet-size JPEGs to augmented batches, ``meshfeed.vision``."""

from __future__ import annotations

import importlib.util
import io
import os
import statistics
import tempfile
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
from harness import arguments, emit, in_rounds, median_of, median_ratio, use_cpu_devices
from PIL import Image
from worker_fns import LOOP

import meshfeed
import meshfeed.vision as vision
from common import Records, Run, loader_batches, loops_at_once, measure, torch_batches

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


class _TorchImages(Records):
    """A map-style dataset: a file read, decoded and augmented as the loop does it."""

    def __init__(self, source: meshfeed.ImageFolderSource, augment: bool) -> None:
        paths = np.asarray([source.path(i) for i in range(len(source))])
        super().__init__({"path": paths, "label": source[np.arange(len(source))]["label"]})
        self.crop = _crop(augment)

    def __getitem__(self, i: int) -> dict[str, np.ndarray]:
        record = super().__getitem__(i)
        image = np.frombuffer(Path(str(record["path"])).read_bytes(), np.uint8)
        return self.crop({"image": image, "label": record["label"]}, np.random.default_rng(i))


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
    with tempfile.TemporaryDirectory(prefix="meshfeed-vision-") as scratch:
        root = write_folder(Path(scratch), args.images, noise=args.noise)
        source = meshfeed.ImageFolderSource(root)
        paths = [source.path(i) for i in range(len(source))]
        kb = statistics.mean(os.path.getsize(p) for p in paths) / 1e3
        work = {"work": "resized_crop", "source": paths, "augment": augment}
        loop = LOOP.format(here=str(Path(__file__).resolve().parent), seconds=args.seconds, **work)

        def workers(decoder: str) -> Run:
            crop = _crop(augment, decoder)
            return loader_batches(lambda: source, BATCH, record_transform=crop, num_workers=2)

        dataset = _TorchImages(source, augment)
        runs = {
            "meshfeed:2": workers("pillow"),
            "torch:2": torch_batches(dataset, BATCH, workers=2, prefetch_factor=4, pin_memory=True),
        }
        if importlib.util.find_spec("nvidia") and importlib.util.find_spec("nvidia.nvimgcodec"):
            runs["meshfeed-nvimgcodec-cpu:2"] = workers("nvimgcodec-cpu")
        entries: dict[str, Any] = {LOOPS: lambda: loops_at_once(loop, 2)}
        for name, run in runs.items():  # a reason a peer is skipped stays as it is
            timed = partial(measure, run, BATCH, args.seconds, warmup=2)
            entries[name] = run if isinstance(run, str) else timed
        per_round = in_rounds(entries, args.rounds)
    common = {"images": args.images, "kb": round(kb, 1), "rounds": args.rounds}
    for name, entry in entries.items():
        figures: dict[str, Any] = {"skipped": entry}
        if not isinstance(entry, str):
            figures = {"images_per_s": round(median_of(per_round, name) or 0.0, 1)}
            figures["over_loops_x2"] = median_ratio(per_round, name, LOOPS)
        line = {"workload": "I", "entry": name, **common, "augment": args.augment, **figures}
        emit("vision", smoke=args.smoke, **line)


if __name__ == "__main__":
    main()
