"""A folder of JPEG and PNG files in class subfolders, and torchvision's reading of it.

``torchvision_samples`` is ``torchvision.datasets.ImageFolder``'s ``find_classes`` and
``make_dataset``, as torchvision 0.29 writes them (torchvision cannot be installed beside
the CPU torch the tests use), so that the tests compare with its rule, not ours.
"""

from __future__ import annotations

import io
import os
from pathlib import Path

import numpy as np
from PIL import Image

TORCHVISION_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")


def encode(pixels: np.ndarray, kind: str) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format=kind, **({"quality": 90} if kind == "JPEG" else {}))
    return buffer.getvalue()


def image(rng: np.random.Generator, height: int, width: int) -> np.ndarray:
    """A smooth image with some noise (JPEG-like content), ``uint8`` RGB."""
    y, x = np.mgrid[0:height, 0:width]
    base = np.stack([x * 255 // max(1, width), y * 255 // max(1, height), (x + y) % 256], -1)
    return np.clip(base + rng.integers(0, 40, (height, width, 3)), 0, 255).astype(np.uint8)


def image_folder(root: Path, per_class: int = 6, seed: int = 0) -> Path:
    """Classes ``Dog``, ``bird``, ``cat`` (sorted by code point: ``Dog`` first), JPEGs
    and PNGs of 40-90 pixels a side, one class with a nested folder and upper-case
    extensions, and files no image folder reads (a text file, an image at the root)."""
    rng = np.random.default_rng(seed)
    for c, name in enumerate(["cat", "Dog", "bird"]):
        folder = root / name
        folder.mkdir(parents=True)
        for i in range(per_class):
            kind, ext = ("JPEG", ".jpg") if (i + c) % 3 else ("PNG", ".png")
            if name == "cat" and i % 2:
                ext = ext.upper()
            where = folder / "deeper" if name == "cat" and i >= per_class - 2 else folder
            where.mkdir(exist_ok=True)
            height, width = (int(v) for v in rng.integers(40, 90, 2))
            (where / f"img_{i:03d}{ext}").write_bytes(encode(image(rng, height, width), kind))
        (folder / "notes.txt").write_text("not an image")
    (root / "stray.jpg").write_bytes(encode(image(rng, 40, 40), "JPEG"))
    return root


def folder_with_a_truncated_jpeg(root: Path, per_class: int = 8, bad: int = 13) -> Path:
    """Classes ``a`` and ``b`` of ``per_class`` JPEGs each (gradients and noise, 24 to 64
    pixels a side), the one that is example ``bad`` read in order cut in half: a JPEG
    whose header reads and whose pixels do not decode (``image file is truncated``)."""
    rng = np.random.default_rng(1)
    for c, name in enumerate(["a", "b"]):
        (root / name).mkdir(parents=True)
        for i in range(per_class):
            height, width = (int(v) for v in rng.integers(24, 65, 2))
            data = encode(image(rng, height, width), "JPEG")
            if c * per_class + i == bad:
                data = data[: len(data) // 2]
            (root / name / f"img_{i:03d}.jpg").write_bytes(data)
    return root


def torchvision_samples(directory: str) -> tuple[list[str], list[tuple[str, int]]]:
    """``(classes, [(path, class_index), ...])`` as torchvision's ``ImageFolder`` finds them."""
    classes = sorted(entry.name for entry in os.scandir(directory) if entry.is_dir())
    class_to_idx = {cls_name: i for i, cls_name in enumerate(classes)}
    instances = []
    for target_class in sorted(class_to_idx.keys()):
        class_index = class_to_idx[target_class]
        target_dir = os.path.join(directory, target_class)
        if not os.path.isdir(target_dir):
            continue
        for root, _, fnames in sorted(os.walk(target_dir, followlinks=True)):
            for fname in sorted(fnames):
                path = os.path.join(root, fname)
                if path.lower().endswith(TORCHVISION_EXTENSIONS):
                    instances.append((path, class_index))
    return classes, instances
