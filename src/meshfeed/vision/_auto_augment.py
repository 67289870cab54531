"""The per-image augmentations of the modern ImageNet recipes, as torchvision v2 makes
them: ``TrivialAugmentWide``, ``RandAugment`` and ``ColorJitter``.

Each draws its parameters from the record's generator (``params``: the same law as
torchvision's draws, in the same order) and applies them to a Pillow image with the
Pillow calls torchvision's PIL path makes (``_pil_ops``), so given the same parameters
the pixels are torchvision's. They run after the crop and the flip, inside
``RandomResizedCrop(..., augment=[...])``, in the record workers; a step's images are
the same for any workers and after a resume, since each record's generator depends on
the seed, the epoch and the example only.

The magnitudes are torchvision's tables, computed as ``torch.linspace`` computes them in
float32 (``_linspace``) and widened, as ``float(magnitudes[i])`` widens them there.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from meshfeed.vision._pil_ops import BLACK, Fill, adjust_hue, apply, enhance

Magnitudes = Callable[[int, int, int], np.ndarray | None]


def _linspace(start: float, end: float, steps: int) -> np.ndarray:
    """``torch.linspace(start, end, steps)`` in float32: the first half counted up from
    ``start``, the second down from ``end``, by a float32 step, each value rounded once
    (torch's kernel multiplies and adds fused; float64 holds the product exactly)."""
    start32, end32 = np.float32(start), np.float32(end)
    step = float((end32 - start32) / np.float32(steps - 1)) if steps > 1 else 0.0
    out = np.empty(steps, np.float32)
    for i in range(steps):
        if i < steps // 2:
            out[i] = np.float32(float(start32) + step * i)
        else:
            out[i] = np.float32(float(end32) - step * (steps - i - 1))
    return out


def _posterize(top: int) -> Magnitudes:
    """Posterize's bits: ``(8 - arange(n) / ((n - 1) / top)).round().int()`` in float32."""

    def bits(n: int, height: int, width: int) -> np.ndarray:
        steps = np.arange(n, dtype=np.float32) / np.float32((n - 1) / top)
        return np.round(np.float32(8) - steps).astype(np.int32)

    return bits


def _none(n: int, height: int, width: int) -> None:
    return None


def _space(top: float) -> Magnitudes:
    return lambda n, height, width: _linspace(0.0, top, n)


_SOLARIZE: Magnitudes = lambda n, height, width: _linspace(1.0, 0.0, n)  # noqa: E731

TRIVIAL_WIDE: dict[str, tuple[Magnitudes, bool]] = {
    "Identity": (_none, False),
    "ShearX": (_space(0.99), True),
    "ShearY": (_space(0.99), True),
    "TranslateX": (_space(32.0), True),
    "TranslateY": (_space(32.0), True),
    "Rotate": (_space(135.0), True),
    "Brightness": (_space(0.99), True),
    "Color": (_space(0.99), True),
    "Contrast": (_space(0.99), True),
    "Sharpness": (_space(0.99), True),
    "Posterize": (_posterize(6), False),
    "Solarize": (_SOLARIZE, False),
    "AutoContrast": (_none, False),
    "Equalize": (_none, False),
}
"""TrivialAugmentWide's operations: each name's magnitudes (``num_bins``, height, width)
and whether their sign is drawn."""

RAND_AUGMENT: dict[str, tuple[Magnitudes, bool]] = {
    "Identity": (_none, False),
    "ShearX": (_space(0.3), True),
    "ShearY": (_space(0.3), True),
    "TranslateX": (lambda n, height, width: _linspace(0.0, 150.0 / 331.0 * width, n), True),
    "TranslateY": (lambda n, height, width: _linspace(0.0, 150.0 / 331.0 * height, n), True),
    "Rotate": (_space(30.0), True),
    "Brightness": (_space(0.9), True),
    "Color": (_space(0.9), True),
    "Contrast": (_space(0.9), True),
    "Sharpness": (_space(0.9), True),
    "Posterize": (_posterize(4), False),
    "Solarize": (_SOLARIZE, False),
    "AutoContrast": (_none, False),
    "Equalize": (_none, False),
}
"""RandAugment's operations, as ``TRIVIAL_WIDE``."""

Ops = list[tuple[str, float]]
"""The operations drawn for one image, in order: ``(name, magnitude)``."""


def _fill(fill: Any) -> Fill:
    if fill is None:
        return BLACK
    values = (fill,) * 3 if isinstance(fill, int | float) else tuple(fill)
    if len(values) != 3:
        raise ValueError(f"fill={fill!r} must be one value or three (red, green, blue).")
    return tuple(int(v) for v in values)  # type: ignore[return-value]


def _bins(num_magnitude_bins: object) -> int:
    if isinstance(num_magnitude_bins, bool) or not isinstance(num_magnitude_bins, int):
        raise ValueError(f"num_magnitude_bins={num_magnitude_bins!r} must be an int >= 2.")
    if num_magnitude_bins < 2:
        raise ValueError(f"num_magnitude_bins={num_magnitude_bins!r} must be an int >= 2.")
    return num_magnitude_bins


def _magnitude(
    space: tuple[Magnitudes, bool],
    n: int,
    height: int,
    width: int,
    index: Callable[[], int],
    rng: np.random.Generator,
) -> float:
    """An operation's magnitude: the table's entry at ``index()``, its sign drawn where
    the operation has one (torchvision: ``torch.rand(()) <= 0.5`` negates it)."""
    table, signed = space
    values = table(n, height, width)
    if values is None:
        return 0.0
    magnitude = float(values[index()])
    if signed and rng.random() <= 0.5:
        magnitude = -magnitude
    return magnitude


class TrivialAugmentWide:
    """torchvision's ``TrivialAugmentWide``: one operation of 14, drawn uniformly, at a
    magnitude drawn uniformly from ``num_magnitude_bins``, its sign drawn where it has
    one. Nearest-neighbour for the geometric operations, ``fill`` (black by default)
    outside the image. For ``RandomResizedCrop(..., augment=[TrivialAugmentWide()])``."""

    def __init__(self, num_magnitude_bins: int = 31, *, fill: Any = None) -> None:
        self.num_magnitude_bins = _bins(num_magnitude_bins)
        self.fill = _fill(fill)

    def params(self, height: int, width: int, rng: np.random.Generator) -> Ops:
        """The operation and magnitude for an image of ``height`` x ``width``."""
        names = tuple(TRIVIAL_WIDE)
        name = names[int(rng.integers(len(names)))]
        n = self.num_magnitude_bins
        index = lambda: int(rng.integers(n))  # noqa: E731
        return [(name, _magnitude(TRIVIAL_WIDE[name], n, height, width, index, rng))]

    def apply(self, image: Any, ops: Ops) -> Any:
        """``image`` (Pillow) with ``ops`` applied."""
        for name, magnitude in ops:
            image = apply(image, name, magnitude, fill=self.fill)
        return image


class RandAugment(TrivialAugmentWide):
    """torchvision's ``RandAugment``: ``num_ops`` operations of 14, each drawn uniformly,
    all at the magnitude ``magnitude`` of ``num_magnitude_bins``, each sign drawn where
    the operation has one."""

    def __init__(
        self,
        num_ops: int = 2,
        magnitude: int = 9,
        num_magnitude_bins: int = 31,
        *,
        fill: Any = None,
    ) -> None:
        super().__init__(num_magnitude_bins, fill=fill)
        if isinstance(num_ops, bool) or not isinstance(num_ops, int) or num_ops < 0:
            raise ValueError(f"num_ops={num_ops!r} must be an int >= 0.")
        if isinstance(magnitude, bool) or not isinstance(magnitude, int):
            raise ValueError(f"magnitude={magnitude!r} must be an int bin.")
        if not 0 <= magnitude < self.num_magnitude_bins:
            raise ValueError(
                f"magnitude={magnitude} must be a bin in [0, {self.num_magnitude_bins})."
            )
        self.num_ops = num_ops
        self.magnitude = magnitude

    def params(self, height: int, width: int, rng: np.random.Generator) -> Ops:
        names = tuple(RAND_AUGMENT)
        ops = []
        for _ in range(self.num_ops):
            name = names[int(rng.integers(len(names)))]
            space = RAND_AUGMENT[name]
            n = self.num_magnitude_bins
            ops.append((name, _magnitude(space, n, height, width, lambda: self.magnitude, rng)))
        return ops


def _jitter_range(
    value: Any, name: str, center: float = 1.0, bound: tuple[float, float] = (0, float("inf"))
) -> tuple[float, float] | None:
    """torchvision's ``ColorJitter._check_input``: a number ``v`` is ``[center - v, center
    + v]`` (clipped at 0 but for hue), a pair as given; a range of the centre alone is
    ``None`` (no draw, no change)."""
    if value is None:
        return None
    if isinstance(value, int | float) and not isinstance(value, bool):
        if value < 0:
            raise ValueError(f"{name}={value} must be >= 0 as a single number.")
        low, high = center - value, center + value
        if center == 1.0:
            low = max(low, 0.0)
    elif isinstance(value, tuple | list) and len(value) == 2:
        low, high = float(value[0]), float(value[1])
    else:
        raise ValueError(f"{name}={value!r} must be a number or a (low, high) pair.")
    if not bound[0] <= low <= high <= bound[1]:
        raise ValueError(f"{name}={value!r}: the range must lie in {bound}, low <= high.")
    return None if low == high == center else (float(low), float(high))


class ColorJitter:
    """torchvision's ``ColorJitter``: brightness, contrast, saturation and hue factors
    drawn uniformly in their ranges, applied in a random order.

    Args:
      brightness, contrast, saturation: ``v`` for factors in ``[max(0, 1 - v), 1 + v]``,
        or ``(low, high)``.
      hue: ``h`` for shifts in ``[-h, h]`` (``h`` <= 0.5), or ``(low, high)``.
    """

    def __init__(
        self,
        brightness: Any = None,
        contrast: Any = None,
        saturation: Any = None,
        hue: Any = None,
    ) -> None:
        self.brightness = _jitter_range(brightness, "brightness")
        self.contrast = _jitter_range(contrast, "contrast")
        self.saturation = _jitter_range(saturation, "saturation")
        self.hue = _jitter_range(hue, "hue", center=0.0, bound=(-0.5, 0.5))

    def params(self, height: int, width: int, rng: np.random.Generator) -> Ops:
        """The order (a permutation of the four) and the factors drawn (float32, in the
        order brightness, contrast, saturation, hue, each only when it has a range)."""
        order = rng.permutation(4)
        ranges = (self.brightness, self.contrast, self.saturation, self.hue)
        factors = [None if r is None else float(np.float32(rng.uniform(*r))) for r in ranges]
        names = ("Brightness", "Contrast", "Color", "Hue")
        return [(names[i], factors[i]) for i in order if factors[i] is not None]  # type: ignore[misc]

    def apply(self, image: Any, ops: Ops) -> Any:
        """``image`` (Pillow) with the drawn factors applied in their order."""
        for name, factor in ops:
            image = adjust_hue(image, factor) if name == "Hue" else enhance(image, name, factor)
        return image


Augment = TrivialAugmentWide | RandAugment | ColorJitter
"""A per-image augmentation ``RandomResizedCrop(..., augment=[...])`` takes."""
