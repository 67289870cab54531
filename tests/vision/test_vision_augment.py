"""``meshfeed.vision``'s per-image augmentations: TrivialAugmentWide, RandAugment and
ColorJitter give torchvision v2's pixels given the same drawn parameters, draw them from
torchvision's laws, and run after the crop in any workers with the same bytes.

torchvision cannot be installed beside the CPU torch the tests use, so its PIL path is
written out below from its source (``_auto_augment._apply_image_or_video_transform``,
``functional._geometry``'s PIL kernels with the inverse affine matrix of
``transforms/functional.py``, ``_functional_pil``), and its magnitude tables are
computed with torch itself.
"""

from __future__ import annotations

import io
import math

import jax
import numpy as np
import pytest
from PIL import Image, ImageEnhance, ImageOps
from scipy import stats

import meshfeed
import meshfeed.vision as vision
from image_fns import image_folder
from meshfeed.vision._auto_augment import RAND_AUGMENT, TRIVIAL_WIDE, _linspace

torch = pytest.importorskip("torch", reason="the magnitude tables are checked against torch")


def _tv_inverse_affine(center, angle, translate, scale, shear):
    """``torchvision.transforms.functional._get_inverse_affine_matrix``, as written there."""
    rot = math.radians(angle)
    sx, sy = math.radians(shear[0]), math.radians(shear[1])
    cx, cy = center
    tx, ty = translate
    a = math.cos(rot - sy) / math.cos(sy)
    b = -math.cos(rot - sy) * math.tan(sx) / math.cos(sy) - math.sin(rot)
    c = math.sin(rot - sy) / math.cos(sy)
    d = -math.sin(rot - sy) * math.tan(sx) / math.cos(sy) + math.cos(rot)
    matrix = [d, -b, 0.0, -c, a, 0.0]
    matrix = [x / scale for x in matrix]
    matrix[2] += matrix[0] * (-cx - tx) + matrix[1] * (-cy - ty)
    matrix[5] += matrix[3] * (-cx - tx) + matrix[4] * (-cy - ty)
    matrix[2] += cx
    matrix[5] += cy
    return matrix


def _tv_affine(img, translate, shear, center=None):
    if center is None:
        center = [img.size[0] * 0.5, img.size[1] * 0.5]
    matrix = _tv_inverse_affine(center, 0.0, translate, 1.0, shear)
    return img.transform(img.size, Image.Transform.AFFINE, matrix, 0, fillcolor=(0, 0, 0))


ENHANCERS = {"Brightness": ImageEnhance.Brightness, "Color": ImageEnhance.Color,
             "Contrast": ImageEnhance.Contrast, "Sharpness": ImageEnhance.Sharpness}  # fmt: skip


def _tv_apply(img, op, magnitude):
    """torchvision v2's ``_apply_image_or_video_transform`` for a PIL image, fill=None."""
    if op == "Identity":
        return img
    if op == "ShearX":
        return _tv_affine(img, [0, 0], [math.degrees(math.atan(magnitude)), 0.0], [0.0, 0.0])
    if op == "ShearY":
        return _tv_affine(img, [0, 0], [0.0, math.degrees(math.atan(magnitude))], [0.0, 0.0])
    if op == "TranslateX":
        return _tv_affine(img, [int(magnitude), 0], [0.0, 0.0])
    if op == "TranslateY":
        return _tv_affine(img, [0, int(magnitude)], [0.0, 0.0])
    if op == "Rotate":
        return img.rotate(magnitude, 0, False, None, fillcolor=(0, 0, 0))
    if op in ENHANCERS:
        return ENHANCERS[op](img).enhance(1.0 + magnitude)
    if op == "Posterize":
        return ImageOps.posterize(img, int(magnitude))
    if op == "Solarize":
        return ImageOps.solarize(img, 255.0 * magnitude)
    return {"AutoContrast": ImageOps.autocontrast, "Equalize": ImageOps.equalize,
            "Invert": ImageOps.invert}[op](img)  # fmt: skip


def _tv_adjust_hue(img, hue_factor):
    h, s, v = img.convert("HSV").split()
    np_h = np.array(h, dtype=np.uint8)
    np_h += np.int32(hue_factor * 255).astype(np.uint8)
    return Image.merge("HSV", (Image.fromarray(np_h, "L"), s, v)).convert(img.mode)


@pytest.fixture(scope="module")
def photo():
    """A 48x40 RGB image with gradients, edges and a full range of values."""
    rng = np.random.default_rng(1)
    yy, xx = np.mgrid[:40, :48]
    pixels = np.stack([xx * 5, yy * 6, (xx + yy) * 3], -1) + rng.integers(0, 30, (40, 48, 3))
    pixels[10:20, 12:30] = (240, 20, 90)
    return Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8))


def test_each_operation_is_torchvisions_given_its_magnitude(photo):
    ops = [*TRIVIAL_WIDE, "Invert"]
    for op in ops:
        table = TRIVIAL_WIDE.get(op, (lambda n, h, w: None, False))[0](31, 40, 48)
        magnitudes = [0.0] if table is None else [float(table[i]) for i in (0, 7, 19, 30)]
        signed = op in TRIVIAL_WIDE and TRIVIAL_WIDE[op][1]
        for magnitude in magnitudes + ([-m for m in magnitudes] if signed else []):
            got = np.asarray(vision.TrivialAugmentWide().apply(photo, [(op, magnitude)]))
            want = np.asarray(_tv_apply(photo, op, magnitude))
            np.testing.assert_array_equal(got, want, err_msg=f"{op} {magnitude}")
    jitter = vision.ColorJitter(hue=0.5)
    for factor in (-0.5, -0.1, 0.03, 0.37, 0.5):
        got = np.asarray(jitter.apply(photo, [("Hue", factor)]))
        np.testing.assert_array_equal(got, np.asarray(_tv_adjust_hue(photo, factor)))


def test_the_magnitude_tables_are_torchvisions():
    """torch.linspace in float32, and the Posterize bits' formula, computed by torch."""
    for n in (31, 10, 2):
        for top in (0.99, 32.0, 135.0, 0.3, 0.9, 150.0 / 331.0 * 224):
            want = torch.linspace(0.0, top, n).numpy()
            np.testing.assert_array_equal(_linspace(0.0, top, n), want)
        np.testing.assert_array_equal(
            TRIVIAL_WIDE["Solarize"][0](n, 1, 1), torch.linspace(1.0, 0.0, n).numpy()
        )
        for space, top in ((TRIVIAL_WIDE, 6), (RAND_AUGMENT, 4)):
            bits = (8 - (torch.arange(n) / ((n - 1) / top))).round().int().numpy()
            np.testing.assert_array_equal(space["Posterize"][0](n, 1, 1), bits)
    width = RAND_AUGMENT["TranslateX"][0](31, 100, 224)
    np.testing.assert_array_equal(width, torch.linspace(0.0, 150.0 / 331.0 * 224, 31).numpy())


def test_the_draws_follow_torchvisions_laws():
    """A seeded check: these seeds pass, and the checks tell a wrong law apart."""
    trivial = vision.TrivialAugmentWide()
    drawn = [trivial.params(224, 224, np.random.default_rng(i))[0] for i in range(4200)]
    names = list(TRIVIAL_WIDE)
    counts = np.bincount([names.index(n) for n, _ in drawn], minlength=len(names))
    assert stats.chisquare(counts).pvalue > 1e-3
    assert stats.chisquare([*counts[:7].tolist(), counts[7] * 2]).pvalue < 1e-6
    rotations = np.array([m for n, m in drawn if n == "Rotate"])
    table = TRIVIAL_WIDE["Rotate"][0](31, 224, 224)
    assert table is not None
    bins = np.bincount(np.searchsorted(table, np.abs(rotations).astype(np.float32)), minlength=31)
    assert len(bins) == 31 and stats.chisquare(bins).pvalue > 1e-3
    signs = (rotations[rotations != 0] < 0).mean()
    assert abs(signs - 0.5) < 4 * math.sqrt(0.25 / (rotations != 0).sum())
    rand = vision.RandAugment(num_ops=3, magnitude=9)
    ops = rand.params(100, 224, np.random.default_rng(0))
    assert len(ops) == 3
    for name, magnitude in ops:
        table = RAND_AUGMENT[name][0](31, 100, 224)
        assert magnitude == 0.0 if table is None else abs(magnitude) == float(table[9])
    jitter = vision.ColorJitter(brightness=0.4, contrast=0.4, saturation=0.4, hue=0.1)
    params = [jitter.params(8, 8, np.random.default_rng(i)) for i in range(2400)]
    orders = np.unique([",".join(n for n, _ in p) for p in params], return_counts=True)[1]
    assert len(orders) == 24 and stats.chisquare(orders).pvalue > 1e-3
    brightness = [f for p in params for n, f in p if n == "Brightness"]
    assert stats.kstest(brightness, stats.uniform(0.6, 0.8).cdf).pvalue > 1e-3
    hue = [f for p in params for n, f in p if n == "Hue"]
    assert stats.kstest(hue, stats.uniform(-0.1, 0.2).cdf).pvalue > 1e-3
    assert vision.ColorJitter(brightness=0, hue=0.2).params(8, 8, np.random.default_rng(0))
    assert [n for n, _ in vision.ColorJitter(brightness=0, hue=0.2).params(
        8, 8, np.random.default_rng(0))] == ["Hue"]  # fmt: skip


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return image_folder(tmp_path_factory.mktemp("images") / "train")


def test_after_the_crop_with_the_records_generator(folder):
    source = meshfeed.ImageFolderSource(folder)
    augment = [vision.TrivialAugmentWide(), vision.ColorJitter(0.4, 0.4, 0.4, 0.1)]
    crop = vision.RandomResizedCrop(32, augment=augment)
    for i in range(len(source)):
        record = source[i]
        out = crop(dict(record), np.random.default_rng(i))["image"]
        rng = np.random.default_rng(i)
        box, flip = crop.params(*vision.image_size(record["image"]), rng)
        ops = [a.params(32, 32, rng) for a in augment]
        top, left, h, w = box
        with Image.open(io.BytesIO(record["image"].tobytes())) as im:
            img = im.convert("RGB").crop((left, top, left + w, top + h)).resize((32, 32), 2)
        img = img.transpose(Image.Transpose.FLIP_LEFT_RIGHT) if flip else img
        name, magnitude = ops[0][0]
        img = _tv_apply(img, name, magnitude)
        for name, factor in ops[1]:
            hue = name == "Hue"
            img = _tv_adjust_hue(img, factor) if hue else ENHANCERS[name](img).enhance(factor)
        np.testing.assert_array_equal(out, np.asarray(img))


def test_the_same_bytes_for_any_workers(folder):
    crop = vision.RandomResizedCrop(24, augment=[vision.RandAugment(), vision.ColorJitter(0.3)])
    sharding = meshfeed.batch_sharding(meshfeed.make_mesh(data=8))

    def batches(**workers):
        source = meshfeed.ImageFolderSource(folder)
        loader = meshfeed.Loader(source, global_batch_size=8, sharding=sharding, seed=5,
                                 record_transform=crop, **workers)  # fmt: skip
        out = [np.asarray(b["image"]) for b in loader]
        loader.close()
        return out

    alone = batches()
    for workers in ({"num_workers": 2}, {"num_workers": 2, "worker_type": "threads"}):
        for got, want in zip(batches(**workers), alone, strict=True):
            np.testing.assert_array_equal(got, want)
    assert jax.device_count() == 8


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="num_magnitude_bins"):
        vision.TrivialAugmentWide(1)
    with pytest.raises(ValueError, match=r"magnitude=31 must be a bin in \[0, 31\)"):
        vision.RandAugment(magnitude=31)
    with pytest.raises(ValueError, match="num_ops"):
        vision.RandAugment(num_ops=-1)
    with pytest.raises(ValueError, match="hue"):
        vision.ColorJitter(hue=0.7)
    with pytest.raises(ValueError, match="brightness=-1"):
        vision.ColorJitter(brightness=-1)
    with pytest.raises(ValueError, match="fill"):
        vision.TrivialAugmentWide(fill=(1, 2))
    with pytest.raises(TypeError, match="augment holds a function"):
        vision.RandomResizedCrop(32, augment=[lambda r, g: r])  # type: ignore[list-item]
