"""Where an image is cut: torchvision's sampling rules, on numpy's generator.

``random_resized_crop`` is ``torchvision.transforms.RandomResizedCrop.get_params``: up to
ten tries of an area (a uniform share of the image's, in ``scale``) and an aspect ratio
(log-uniform in ``ratio``), rounded to whole pixels, the first that fits placed
uniformly; after ten misses, the whole image, clamped to the ratio range and centred.
The draws come from the example's own generator (seeded by seed, epoch and example id),
so the box is the same on every worker and every decoder. ``resize_shorter`` and
``center_crop`` are torchvision's ``Resize(n)`` and ``CenterCrop(n)`` sizes: the longer
side truncated, the offsets rounded half to even.
"""

from __future__ import annotations

import math

import numpy as np

Box = tuple[int, int, int, int]
"""``(top, left, height, width)`` of a crop, in pixels of the image."""


def random_resized_crop(
    height: int,
    width: int,
    rng: np.random.Generator,
    scale: tuple[float, float] = (0.08, 1.0),
    ratio: tuple[float, float] = (3 / 4, 4 / 3),
) -> Box:
    """A crop of an image of ``height`` x ``width`` by torchvision's rule (module)."""
    area = height * width
    log_ratio = (math.log(ratio[0]), math.log(ratio[1]))
    for _ in range(10):
        target_area = area * rng.uniform(scale[0], scale[1])
        aspect_ratio = math.exp(rng.uniform(log_ratio[0], log_ratio[1]))
        w = round(math.sqrt(target_area * aspect_ratio))
        h = round(math.sqrt(target_area / aspect_ratio))
        if 0 < w <= width and 0 < h <= height:
            top = int(rng.integers(0, height - h + 1))
            left = int(rng.integers(0, width - w + 1))
            return top, left, h, w
    in_ratio = width / height
    if in_ratio < min(ratio):
        w, h = width, round(width / min(ratio))
    elif in_ratio > max(ratio):
        h, w = height, round(height * max(ratio))
    else:
        w, h = width, height
    return (height - h) // 2, (width - w) // 2, h, w


def resize_shorter(height: int, width: int, size: int) -> tuple[int, int]:
    """``(height, width)`` after torchvision's ``Resize(size)``: the shorter side to
    ``size``, the longer in proportion, truncated."""
    if width <= height:
        return int(size * height / width), size
    return size, int(size * width / height)


def center_crop(height: int, width: int, size: int) -> Box:
    """The centred ``size`` square of an image of ``height`` x ``width`` (torchvision's
    ``CenterCrop``: offsets rounded half to even)."""
    if size > height or size > width:
        raise ValueError(
            f"a {size}x{size} centre crop does not fit a {height}x{width} image; resize it "
            "to at least that first (CenterCrop(resize=) >= size)."
        )
    return round((height - size) / 2.0), round((width - size) / 2.0), size, size
