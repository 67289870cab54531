"""The batch's own augmentations, on the devices: ``Normalize``, MixUp and CutMix.

These run after placement, inside the jitted step, on the global ``jax.Array`` batch as
it is sharded: every function is elementwise over the batch or rolls it by one (XLA
moves one row a device), so its output keeps the input's sharding. They follow
torchvision v2: ``normalize`` is ``ToDtype(float32, scale=True)`` then ``Normalize``;
``mixup`` and ``cutmix`` are ``MixUp`` and ``CutMix`` -- one draw a batch, each image
mixed with the one before it in the batch (``roll(1, 0)``), the labels one-hot and mixed
with the same weight (for CutMix, the share of the area left, after the box is clipped
to the image) -- and ``mixup_or_cutmix`` is ``RandomChoice([MixUp, CutMix])``, the
references' recipes. The draws come from the key alone (``mix_params``), so a step's
mixing is the same on any mesh and after a resume. Images are channels last, ``[batch,
height, width, channels]``, as the loader hands them out. None of the listed libraries
(dm-pix, Optax) has batch mixing; it is a few lines of ``jax.numpy`` here.

JAX is imported inside the functions: record workers import ``meshfeed.vision`` without
it.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

IMAGENET_MEAN = (0.485, 0.456, 0.406)
"""The ImageNet means of the red, green and blue channels, on a 0-1 scale."""
IMAGENET_STD = (0.229, 0.224, 0.225)
"""Their standard deviations."""


def normalize(
    images: Any, mean: Any = IMAGENET_MEAN, std: Any = IMAGENET_STD, *, dtype: Any = None
) -> Any:
    """``(images * (1/255) - mean) / std`` per channel (the last axis): torchvision's
    ``ToDtype(torch.float32, scale=True)`` then ``Normalize(mean, std)``.

    Args:
      images: ``uint8`` pixels (scaled to 0-1 first), or floats already on a 0-1 scale.
      mean, std: one value per channel, on the 0-1 scale.
      dtype: the output's float type (``jnp.float32`` by default; ``jnp.bfloat16`` for a
        model that runs in it).
    """
    import jax.numpy as jnp

    dtype = jnp.float32 if dtype is None else dtype
    x = jnp.asarray(images)
    if x.dtype == jnp.uint8:  # torchvision's scale: times 1/255 in float32, not / 255
        x = x.astype(jnp.float32) * jnp.float32(1.0 / 255)
    else:
        x = x.astype(jnp.float32)
    mean, std = jnp.asarray(mean, jnp.float32), jnp.asarray(std, jnp.float32)
    if mean.shape not in ((), x.shape[-1:]) or std.shape not in ((), x.shape[-1:]):
        raise ValueError(
            f"mean {tuple(mean.shape)} and std {tuple(std.shape)} need one value per channel "
            f"(the last axis of images {tuple(x.shape)}), or one for all."
        )
    return ((x - mean) / std).astype(dtype)


class MixParams(NamedTuple):
    """What one batch's mixing drew (``mix_params``): all scalars, traced under ``jit``."""

    cut: Any
    """CutMix (``True``) or MixUp (``False``)."""
    lam: Any
    """The weight drawn from ``Beta(alpha, alpha)``: the image's own share."""
    center: Any
    """CutMix's box centre ``(y, x)``, uniform over the pixels (``[0, height)``, ``[0,
    width)``); drawn for MixUp too, and unused."""


def mix_params(
    key: Any,
    height: int,
    width: int,
    *,
    mixup_alpha: float = 0.8,
    cutmix_alpha: float = 1.0,
) -> MixParams:
    """One batch's draws: MixUp or CutMix with even odds (one of them when the other's
    alpha is 0), the weight from ``Beta(alpha, alpha)`` of the one chosen, CutMix's box
    centre uniform over the image."""
    import jax
    import jax.numpy as jnp

    _check_alphas(mixup_alpha, cutmix_alpha)
    choose, lam_key, y_key, x_key = jax.random.split(key, 4)
    if mixup_alpha and cutmix_alpha:
        cut = jax.random.bernoulli(choose)
    else:
        cut = jnp.asarray(bool(cutmix_alpha))
    alpha = jnp.where(cut, cutmix_alpha or 1.0, mixup_alpha or 1.0)
    lam = jax.random.beta(lam_key, alpha, alpha)
    center = (jax.random.randint(y_key, (), 0, height), jax.random.randint(x_key, (), 0, width))
    return MixParams(cut, lam, center)


def mix_batch(images: Any, labels: Any, num_classes: int, params: MixParams) -> tuple[Any, Any]:
    """The batch mixed as ``params`` say: ``(images, soft labels)``, the labels one-hot
    ``float32`` ``[batch, num_classes]`` mixed with the images' weights (torchvision v2's
    ``MixUp`` and ``CutMix``). Images come back as floats (MixUp's blend); mix after
    ``normalize``."""
    import jax.numpy as jnp

    x = jnp.asarray(images)
    if x.ndim != 4:
        raise ValueError(f"images {tuple(x.shape)} must be [batch, height, width, channels].")
    labels = jnp.asarray(labels)
    if labels.shape != x.shape[:1]:
        raise ValueError(
            f"labels {tuple(labels.shape)} must be one class index an image ({x.shape[0]})."
        )
    x = x if jnp.issubdtype(x.dtype, jnp.floating) else x.astype(jnp.float32)
    height, width = x.shape[1], x.shape[2]
    y1, y2, x1, x2 = _box(params, height, width)
    rows = jnp.arange(height)[:, None]
    cols = jnp.arange(width)[None, :]
    inside = (rows >= y1) & (rows < y2) & (cols >= x1) & (cols < x2)
    area_left = 1.0 - (y2 - y1) * (x2 - x1) / (height * width)
    weight = jnp.where(params.cut, area_left, params.lam).astype(jnp.float32)
    rolled = jnp.roll(x, 1, axis=0)
    lam = params.lam.astype(x.dtype)
    blended = rolled * (1 - lam) + x * lam
    cut = jnp.where(inside[None, :, :, None], rolled, x)
    out = jnp.where(params.cut, cut, blended)
    one_hot = (labels[:, None] == jnp.arange(num_classes)[None, :]).astype(jnp.float32)
    soft = jnp.roll(one_hot, 1, axis=0) * (1 - weight) + one_hot * weight
    return out, soft


def _box(params: MixParams, height: int, width: int) -> tuple[Any, Any, Any, Any]:
    """CutMix's box ``(y1, y2, x1, x2)``: half-sides ``int(0.5 * sqrt(1 - lam) * side)``
    around the centre, clipped to the image (torchvision's rule)."""
    import jax.numpy as jnp

    r = 0.5 * jnp.sqrt(1.0 - params.lam)
    half_h = jnp.floor(r * height).astype(jnp.int32)
    half_w = jnp.floor(r * width).astype(jnp.int32)
    cy, cx = params.center
    y1, y2 = jnp.maximum(cy - half_h, 0), jnp.minimum(cy + half_h, height)
    x1, x2 = jnp.maximum(cx - half_w, 0), jnp.minimum(cx + half_w, width)
    return y1, y2, x1, x2


def mixup(key: Any, images: Any, labels: Any, num_classes: int, *, alpha: float = 1.0) -> Any:
    """torchvision v2's ``MixUp(alpha=alpha, num_classes=num_classes)`` on the batch:
    ``(images, soft labels)``."""
    height, width = _spatial(images)
    params = mix_params(key, height, width, mixup_alpha=alpha, cutmix_alpha=0.0)
    return mix_batch(images, labels, num_classes, params)


def cutmix(key: Any, images: Any, labels: Any, num_classes: int, *, alpha: float = 1.0) -> Any:
    """torchvision v2's ``CutMix(alpha=alpha, num_classes=num_classes)`` on the batch:
    ``(images, soft labels)``."""
    height, width = _spatial(images)
    params = mix_params(key, height, width, mixup_alpha=0.0, cutmix_alpha=alpha)
    return mix_batch(images, labels, num_classes, params)


def mixup_or_cutmix(
    key: Any,
    images: Any,
    labels: Any,
    num_classes: int,
    *,
    mixup_alpha: float = 0.8,
    cutmix_alpha: float = 1.0,
) -> Any:
    """``RandomChoice([MixUp(mixup_alpha), CutMix(cutmix_alpha)])`` on the batch (DeiT's
    and timm's alphas by default): ``(images, soft labels)``. Use it in the loss
    function, with a key new each step::

        images, targets = vision.mixup_or_cutmix(key, vision.normalize(batch["image"]),
                                                 batch["label"], num_classes=1000)
        loss = optax.softmax_cross_entropy(model(images), targets)
    """
    height, width = _spatial(images)
    params = mix_params(key, height, width, mixup_alpha=mixup_alpha, cutmix_alpha=cutmix_alpha)
    return mix_batch(images, labels, num_classes, params)


def _spatial(images: Any) -> tuple[int, int]:
    shape = getattr(images, "shape", ())
    if len(shape) != 4:
        raise ValueError(f"images {tuple(shape)} must be [batch, height, width, channels].")
    return int(shape[1]), int(shape[2])


def _check_alphas(mixup_alpha: float, cutmix_alpha: float) -> None:
    for name, alpha in (("mixup_alpha", mixup_alpha), ("cutmix_alpha", cutmix_alpha)):
        if not isinstance(alpha, int | float) or not math.isfinite(alpha) or alpha < 0:
            raise ValueError(f"{name}={alpha!r} must be a number >= 0 (0: not used).")
    if not (mixup_alpha or cutmix_alpha):
        raise ValueError("mixup_alpha and cutmix_alpha are both 0: nothing to mix.")
