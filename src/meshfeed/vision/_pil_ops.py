"""torchvision v2's image operations on Pillow images: the same Pillow calls with the
same arguments, so the same pixels.

Each is what ``torchvision.transforms.v2.functional`` runs for a ``PIL.Image`` (its
``_functional_pil`` kernels): the geometric ones through ``Image.transform`` with
torchvision's inverse affine matrix and ``Image.rotate``, nearest-neighbour by default,
black outside the image; the colour ones through ``ImageEnhance`` (Pillow blends with
the factor as a C float) and ``ImageOps``; the hue through Pillow's HSV, shifted modulo
256. ``apply`` is AutoAugment's table: an operation's name and magnitude to the call.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

Fill = tuple[int, int, int]
BLACK: Fill = (0, 0, 0)


def _image() -> Any:
    from PIL import Image

    return Image


def inverse_affine(
    center: tuple[float, float],
    angle: float,
    translate: tuple[float, float],
    scale: float,
    shear: tuple[float, float],
) -> list[float]:
    """The matrix ``Image.transform(..., AFFINE, matrix)`` takes for torchvision's
    ``affine`` (output pixel to input pixel), computed in torchvision's order."""
    rot, sx, sy = math.radians(angle), math.radians(shear[0]), math.radians(shear[1])
    cx, cy = center
    tx, ty = translate
    cos_sy, tan_sx = math.cos(sy), math.tan(sx)
    a = math.cos(rot - sy) / cos_sy
    b = -(a * tan_sx + math.sin(rot))
    c = math.sin(rot - sy) / cos_sy
    d = math.cos(rot) - c * tan_sx
    matrix = [d / scale, -b / scale, 0.0, -c / scale, a / scale, 0.0]
    matrix[2] += cx - matrix[0] * (cx + tx) - matrix[1] * (cy + ty)
    matrix[5] += cy - matrix[3] * (cx + tx) - matrix[4] * (cy + ty)
    return matrix


def affine(
    image: Any,
    *,
    translate: tuple[float, float] = (0.0, 0.0),
    shear: tuple[float, float] = (0.0, 0.0),
    center: tuple[float, float] | None = None,
    resample: int = 0,
    fill: Fill = BLACK,
) -> Any:
    """torchvision's ``affine`` (no rotation, scale 1) of a Pillow image; ``center``
    ``None``: the image's (``width / 2``, ``height / 2``)."""
    if center is None:
        center = (image.width * 0.5, image.height * 0.5)
    matrix = inverse_affine(center, 0.0, translate, 1.0, shear)
    return image.transform(image.size, _image().Transform.AFFINE, matrix, resample, fillcolor=fill)


def rotate(image: Any, degrees: float, *, resample: int = 0, fill: Fill = BLACK) -> Any:
    """torchvision's ``rotate`` (counter-clockwise, about the centre, the size kept)."""
    return image.rotate(degrees, resample, False, None, fillcolor=fill)


def enhance(image: Any, kind: str, factor: float) -> Any:
    """``ImageEnhance``'s ``kind`` (Brightness, Color, Contrast, Sharpness) by ``factor``:
    torchvision's ``adjust_brightness``, ``adjust_saturation``, ``adjust_contrast``,
    ``adjust_sharpness``."""
    from PIL import ImageEnhance

    return getattr(ImageEnhance, kind)(image).enhance(factor)


def adjust_hue(image: Any, factor: float) -> Any:
    """torchvision's ``adjust_hue``: Pillow's HSV hue shifted by ``trunc(factor * 255)``
    modulo 256 (``factor`` in [-0.5, 0.5])."""
    if not -0.5 <= factor <= 0.5:
        raise ValueError(f"hue factor {factor} is not in [-0.5, 0.5].")
    Image = _image()
    h, s, v = image.convert("HSV").split()
    hue = np.array(h, dtype=np.uint8)
    hue += np.int32(factor * 255).astype(np.uint8)  # wraps modulo 256, as wanted
    return Image.merge("HSV", (Image.fromarray(hue, "L"), s, v)).convert(image.mode)


def apply(image: Any, op: str, magnitude: float, *, resample: int = 0, fill: Fill = BLACK) -> Any:
    """AutoAugment's operation ``op`` at ``magnitude`` (torchvision v2's
    ``_apply_image_or_video_transform``, for a Pillow image)."""
    from PIL import ImageOps

    if op == "Identity":
        return image
    if op in ("ShearX", "ShearY"):
        degrees = math.degrees(math.atan(magnitude))
        shear = (degrees, 0.0) if op == "ShearX" else (0.0, degrees)
        return affine(image, shear=shear, center=(0.0, 0.0), resample=resample, fill=fill)
    if op in ("TranslateX", "TranslateY"):
        shift = (int(magnitude), 0) if op == "TranslateX" else (0, int(magnitude))
        return affine(image, translate=shift, resample=resample, fill=fill)
    if op == "Rotate":
        return rotate(image, magnitude, resample=resample, fill=fill)
    if op in ("Brightness", "Color", "Contrast", "Sharpness"):
        return enhance(image, op, 1.0 + magnitude)
    if op == "Posterize":
        return ImageOps.posterize(image, int(magnitude))
    if op == "Solarize":
        return ImageOps.solarize(image, 255.0 * magnitude)  # type: ignore[arg-type]  # a float, as torchvision
    if op == "AutoContrast":
        return ImageOps.autocontrast(image)
    if op == "Equalize":
        return ImageOps.equalize(image)
    if op == "Invert":
        return ImageOps.invert(image)
    raise ValueError(f"no image operation {op!r}.")
