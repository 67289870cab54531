"""The standard image pipelines as record work: the training crop and the eval crop.

``RandomResizedCrop`` is ImageNet training's augmentation as torchvision makes it: the
image decoded as torchvision's loader decodes it (``Image.open(...).convert("RGB")``,
no EXIF rotation), a crop by ``random_resized_crop`` cut out and resized to ``size`` with
Pillow's antialiased bilinear filter (``crop`` then ``resize``: the same pixels as
torchvision's PIL path), and flipped left-right half the time. ``CenterCrop`` is the
eval path: the shorter side resized to ``resize``, the centre ``size`` square. Both
take a record and its generator and return the record with ``uint8`` ``[size, size,
3]`` pixels in place of the encoded bytes, so they run as a ``record_transform``, in
worker processes, threads or Ray actors; normalising belongs on the device.

The decode is Pillow's, or nvImageCodec's (``decoder=``): then a chunk of records is
decoded at once, each only in its crop (``_nvimgcodec``) -- on the GPU's JPEG engines
where there is one -- through the record stage's batch form (``prepare`` each record
with its generator: the header read and the draws, the same as Pillow's path; then
``batch``). The crop and the flip come from the record's generator either way, so every
decoder cuts the same boxes. A chunk that does not decode (a file cut short) is decoded
again a record at a time, so the error names the record's example and file, and
``on_error="skip"`` skips that record alone.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from typing import Any, Literal

import numpy as np

from meshfeed.vision._auto_augment import Augment, ColorJitter, Ops, TrivialAugmentWide
from meshfeed.vision._crop import Box, center_crop, random_resized_crop, resize_shorter
from meshfeed.vision._nvimgcodec import NvImageCodec, installed

Prepared = tuple[Box, bool] | tuple[Box, bool, list[Ops]]
"""A record's draws (``RandomResizedCrop.prepare``): its crop, its flip, and the
operations of each augmentation."""
Decoder = Literal["pillow", "nvimgcodec-gpu", "nvimgcodec-cpu", "auto"]
"""What decodes ``RandomResizedCrop``'s images (see there)."""
DECODERS = ("pillow", "nvimgcodec-gpu", "nvimgcodec-cpu", "auto")


def _resolve(decoder: str) -> str:
    """``decoder``, with ``"auto"`` made the GPU's decoders where JAX runs on a GPU and
    nvImageCodec is installed, else Pillow."""
    if decoder != "auto":
        if decoder != "pillow" and not installed():
            raise ImportError(
                f"decoder={decoder!r} needs nvImageCodec: pip install 'meshfeed[gpu-decode]' "
                "(from a clone: pip install -e '.[gpu-decode]'), or decoder='pillow'."
            )
        return decoder
    import jax

    gpu = any(d.platform == "gpu" for d in jax.devices())
    return "nvimgcodec-gpu" if gpu and installed() else "pillow"


def _pil() -> Any:
    try:
        from PIL import Image
    except ImportError:
        raise ImportError(
            "meshfeed.vision decodes with Pillow: pip install 'meshfeed[vision]' (from a "
            "clone: pip install -e '.[vision]')."
        ) from None
    return Image


def _open(data: Any) -> Any:
    """A lazily decoded Pillow image of encoded ``data`` (bytes, or a ``uint8`` array)."""
    if isinstance(data, np.ndarray):
        data = data.tobytes()  # a file's bytes: kilobytes, copied once
    return _pil().open(io.BytesIO(data))


def decode(data: Any) -> np.ndarray:
    """Encoded image bytes (JPEG, PNG, WebP, ...) as ``uint8`` ``[height, width, 3]`` RGB,
    as torchvision's loader decodes them (no EXIF rotation)."""
    with _open(data) as image:
        return np.asarray(image.convert("RGB"))


def image_size(data: Any) -> tuple[int, int]:
    """``(height, width)`` of encoded image bytes, from the header alone."""
    with _open(data) as image:
        return image.height, image.width


def _check_size(size: object, name: str = "size") -> int:
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise ValueError(f"{name}={size!r} must be an int >= 1 (pixels).")
    return size


class RandomResizedCrop:
    """ImageNet training's augmentation: a random crop, resized, flipped half the time.

    Args:
      size: the output's height and width.
      scale: the crop's share of the image's area, drawn uniformly in this range.
      ratio: its aspect ratio (width / height), drawn log-uniformly in this range.
      flip: flip left-right half the time.
      field: the field holding the encoded image; its pixels replace it.
      augment: per-image augmentations after the crop and the flip, in order
        (``TrivialAugmentWide()``, ``RandAugment()``, ``ColorJitter(...)``), their
        parameters drawn from the record's generator after the crop's.
      decoder: ``"pillow"``, ``"nvimgcodec-gpu"`` (the GPU's JPEG engines, a chunk of
        records at once: give it no or few workers, it runs where the loader reads),
        ``"nvimgcodec-cpu"`` (nvImageCodec's CPU codecs, a chunk at once), or
        ``"auto"``: the GPU's where JAX runs on one and nvImageCodec is installed (the
        ``gpu-decode`` extra), else Pillow. Every decoder cuts the same crops.

    Example:
      >>> mesh = meshfeed.make_mesh(data=jax.device_count())  # doctest: +SKIP
      >>> loader = meshfeed.Loader(  # doctest: +SKIP
      ...     meshfeed.ImageFolderSource("train/"), global_batch_size=256,
      ...     sharding=meshfeed.batch_sharding(mesh),
      ...     record_transform=meshfeed.vision.RandomResizedCrop(224), num_workers=8)
    """

    def __init__(
        self,
        size: int = 224,
        *,
        scale: tuple[float, float] = (0.08, 1.0),
        ratio: tuple[float, float] = (3 / 4, 4 / 3),
        flip: bool = True,
        field: str = "image",
        augment: Sequence[Augment] = (),
        decoder: Decoder = "pillow",
    ) -> None:
        self.size = _check_size(size)
        self.augment = tuple(augment)
        for a in self.augment:
            if not isinstance(a, TrivialAugmentWide | ColorJitter):
                raise TypeError(
                    f"augment holds a {type(a).__name__}; give meshfeed.vision's "
                    "TrivialAugmentWide, RandAugment or ColorJitter."
                )
        for name, pair in (("scale", scale), ("ratio", ratio)):
            if len(tuple(pair)) != 2 or not 0 < pair[0] <= pair[1]:
                raise ValueError(f"{name}={pair!r} must be (low, high) with 0 < low <= high.")
        if scale[1] > 1:
            raise ValueError(f"scale={scale!r}: a crop's share of the image is at most 1.")
        if decoder not in DECODERS:
            raise ValueError(f"decoder={decoder!r} is not one of {list(DECODERS)}.")
        self.scale = (float(scale[0]), float(scale[1]))
        self.ratio = (float(ratio[0]), float(ratio[1]))
        self.flip = bool(flip)
        self.field = field
        self.decoder: str = _resolve(decoder)
        """The decoder that runs (``"auto"`` resolved where the loader is built)."""
        self._codec = None
        if self.decoder != "pillow":
            self._codec = NvImageCodec("gpu" if self.decoder == "nvimgcodec-gpu" else "cpu")

    def params(self, height: int, width: int, rng: np.random.Generator) -> tuple[Box, bool]:
        """The crop ``(top, left, height, width)`` and the flip, drawn from ``rng``."""
        box = random_resized_crop(height, width, rng, self.scale, self.ratio)
        return box, self.flip and bool(rng.random() < 0.5)

    def __call__(self, record: dict[str, Any], rng: np.random.Generator) -> dict[str, Any]:
        """``record`` with its image cut, resized and maybe flipped."""
        return self.batch([record], [self.prepare(record, rng)])[0]

    def prepare(
        self, record: dict[str, Any], rng: np.random.Generator
    ) -> tuple[Box, bool, list[Ops]]:
        """The record's crop, flip and augmentations, drawn from its generator in that
        order (the header read)."""
        box, flip = self.params(*image_size(record[self.field]), rng)
        return box, flip, [a.params(self.size, self.size, rng) for a in self.augment]

    def batch(
        self, records: list[dict[str, Any]], prepared: Sequence[Prepared]
    ) -> list[dict[str, Any]]:
        """The records cut, resized, flipped and augmented as ``prepare`` drew (a
        ``(box, flip)`` pair: no augmentations), decoded together."""
        image = _pil()
        if self._codec is not None:
            crops = self._codec.regions([r[self.field] for r in records], [p[0] for p in prepared])
            cut = [image.fromarray(c) for c in crops]
        else:
            cut = []
            for record, ((top, left, h, w), *_) in zip(records, prepared, strict=True):
                with _open(record[self.field]) as opened:
                    cut.append(opened.convert("RGB").crop((left, top, left + w, top + h)))
        out = []
        for record, crop, drew in zip(records, cut, prepared, strict=True):
            flip, ops = drew[1], drew[2] if len(drew) > 2 else []
            resized = crop.resize((self.size, self.size), image.BILINEAR)
            if self.augment:  # on the Pillow image, as torchvision's pipeline runs
                if flip:
                    resized = resized.transpose(image.Transpose.FLIP_LEFT_RIGHT)
                for augment, drawn in zip(self.augment, ops, strict=True):
                    resized = augment.apply(resized, drawn)
                pixels = np.asarray(resized)
            else:
                pixels = np.asarray(resized)[:, ::-1] if flip else np.asarray(resized)
            out.append({**record, self.field: np.ascontiguousarray(pixels)})
        return out


class CenterCrop:
    """The eval path: the shorter side resized to ``resize``, the centre ``size`` square.

    Args:
      size: the output's height and width.
      resize: the shorter side's length before the crop (torchvision's ``Resize``);
        ``None``: no resize.
      field: the field holding the encoded image; its pixels replace it.
    """

    def __init__(self, size: int = 224, *, resize: int | None = 256, field: str = "image") -> None:
        self.size = _check_size(size)
        self.resize = None if resize is None else _check_size(resize, "resize")
        if self.resize is not None and self.resize < self.size:
            raise ValueError(f"resize={resize} must be >= size={size}: the crop is cut from it.")
        self.field = field

    def __call__(
        self, record: dict[str, Any], rng: np.random.Generator | None = None
    ) -> dict[str, Any]:
        """``record`` with its image resized and centre-cropped (``rng`` is not used)."""
        with _open(record[self.field]) as image:
            rgb = image.convert("RGB")
        if self.resize is not None:
            height, width = resize_shorter(rgb.height, rgb.width, self.resize)
            if (height, width) != (rgb.height, rgb.width):
                rgb = rgb.resize((width, height), _pil().BILINEAR)
        top, left, h, w = center_crop(rgb.height, rgb.width, self.size)
        pixels = np.asarray(rgb)[top : top + h, left : left + w]
        return {**record, self.field: np.ascontiguousarray(pixels)}
