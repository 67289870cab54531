"""RandomErasing on the devices: torchvision v2's, each image of the global batch drawing
its own box from its own key.

torchvision erases the normalised tensor (after ``ToDtype`` and ``Normalize``), so the
erased value is 0 in normalised units (the mean colour), or noise; here it runs in the
step after ``normalize``, on the batch as it is sharded (elementwise, so the sharding is
kept). The draws are torchvision's, one image at a time: erase with probability ``p``;
then up to ten tries of an area (a uniform share of the image's, in ``scale``) and an
aspect ratio (log-uniform in ``ratio``), ``h = round(sqrt(area * ratio))`` and ``w =
round(sqrt(area / ratio))`` (half to even), the first with ``h < height`` and ``w <
width`` placed uniformly; no erasing when none fits. All ten tries are drawn at once
(a vector a key), and the first that fits is taken.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple


class EraseBoxes(NamedTuple):
    """Each image's box (``erasing_params``): ``[batch]`` int32 arrays; ``height`` 0 where
    an image is not erased."""

    top: Any
    left: Any
    height: Any
    width: Any


def erasing_params(
    key: Any,
    batch: int,
    height: int,
    width: int,
    *,
    p: float = 0.5,
    scale: tuple[float, float] = (0.02, 0.33),
    ratio: tuple[float, float] = (0.3, 3.3),
) -> EraseBoxes:
    """The boxes ``random_erasing`` erases in a batch of ``batch`` images of ``height`` x
    ``width``, drawn from ``key`` (the module docstring)."""
    import jax
    import jax.numpy as jnp

    _check(p, scale, ratio)
    log_ratio = (math.log(ratio[0]), math.log(ratio[1]))

    def one(k: Any) -> tuple[Any, Any, Any, Any]:
        k_p, k_area, k_ratio, k_top, k_left = jax.random.split(k, 5)
        erase = jax.random.uniform(k_p) < p
        area = height * width * jax.random.uniform(k_area, (10,), minval=scale[0], maxval=scale[1])
        aspect = jnp.exp(
            jax.random.uniform(k_ratio, (10,), minval=log_ratio[0], maxval=log_ratio[1])
        )
        h = jnp.round(jnp.sqrt(area * aspect)).astype(jnp.int32)
        w = jnp.round(jnp.sqrt(area / aspect)).astype(jnp.int32)
        fits = (h < height) & (w < width)
        first = jnp.argmax(fits)
        use = erase & fits.any()
        h, w = jnp.where(use, h[first], 0), jnp.where(use, w[first], 0)
        top = jax.random.randint(k_top, (), 0, height - h + 1)
        left = jax.random.randint(k_left, (), 0, width - w + 1)
        return top, left, h, w

    return EraseBoxes(*jax.vmap(one)(jax.random.split(key, batch)))


def random_erasing(
    key: Any,
    images: Any,
    *,
    p: float = 0.5,
    scale: tuple[float, float] = (0.02, 0.33),
    ratio: tuple[float, float] = (0.3, 3.3),
    value: Any = 0.0,
) -> Any:
    """torchvision v2's ``RandomErasing(p, scale, ratio, value)`` on each image of a
    normalised batch ``[batch, height, width, channels]``: a box of each image (with
    probability ``p``) set to ``value`` (a number, one per channel, or ``"random"``:
    standard normal noise)."""
    import jax
    import jax.numpy as jnp

    x = jnp.asarray(images)
    if x.ndim != 4:
        raise ValueError(f"images {tuple(x.shape)} must be [batch, height, width, channels].")
    batch, height, width, channels = x.shape
    box_key, noise_key = jax.random.split(key)
    boxes = erasing_params(box_key, batch, height, width, p=p, scale=scale, ratio=ratio)
    rows = jnp.arange(height)[None, :, None]
    cols = jnp.arange(width)[None, None, :]

    def edge(v: Any) -> Any:
        return v[:, None, None]

    inside = (rows >= edge(boxes.top)) & (rows < edge(boxes.top + boxes.height))
    inside &= (cols >= edge(boxes.left)) & (cols < edge(boxes.left + boxes.width))
    if isinstance(value, str):
        if value != "random":
            raise ValueError(f"value={value!r}: a number, one per channel, or 'random'.")
        fill = jax.random.normal(noise_key, x.shape, x.dtype)
    else:
        fill = jnp.asarray(value, x.dtype)
        if fill.shape not in ((), (channels,), (1,)):
            raise ValueError(f"value={value!r}: a number, or one per channel ({channels}).")
    return jnp.where(inside[..., None], fill, x)


def _check(p: float, scale: tuple[float, float], ratio: tuple[float, float]) -> None:
    if not 0 <= p <= 1:
        raise ValueError(f"p={p!r} must be a probability in [0, 1].")
    if len(scale) != 2 or not 0 <= scale[0] <= scale[1] <= 1:
        raise ValueError(f"scale={scale!r} must be (low, high) shares with 0 <= low <= high <= 1.")
    if len(ratio) != 2 or not 0 < ratio[0] <= ratio[1]:
        raise ValueError(f"ratio={ratio!r} must be (low, high) with 0 < low <= high.")
