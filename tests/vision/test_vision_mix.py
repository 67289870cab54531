"""``meshfeed.vision``'s batch augmentations on the devices: ``normalize``, MixUp and
CutMix are torchvision v2's, given the same draws; they draw from torchvision's
distributions; under ``jit`` on 8 devices they keep the batch's sharding and mix the
same on any mesh.

torchvision cannot be installed beside the CPU torch the tests use, so its code for
these (``ToDtype``, ``Normalize``, ``MixUp._mixup_label``, ``CutMix._get_params`` and
``_transform``, ``RandomErasing.make_params`` and ``erase``, torchvision 0.2x) is written
out below, in numpy (float32 where torch computes in float32) or with torch's own
generator, as a reference that is torchvision's rule, not ours.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

import meshfeed
import meshfeed.vision as vision

torch = pytest.importorskip("torch", reason="RandomErasing's draws are checked against torch's")
CLASSES = 10


def _tv_normalize(images: np.ndarray, mean, std) -> np.ndarray:
    x = images.astype(np.float32) * np.float32(1.0 / 255)  # ToDtype(float32, scale=True)
    return (x - np.float32(mean)) / np.float32(std)  # Normalize: sub_(mean).div_(std)


def _tv_mixup_label(labels: np.ndarray, lam: float) -> np.ndarray:
    label = np.eye(CLASSES, dtype=np.float32)[labels]
    return np.roll(label, 1, 0) * np.float32(1.0 - lam) + label * np.float32(lam)


def _tv_mixup(images: np.ndarray, labels: np.ndarray, lam: float):
    out = np.roll(images, 1, 0) * np.float32(1.0 - lam) + images * np.float32(lam)
    return out, _tv_mixup_label(labels, lam)


def _tv_cutmix(images: np.ndarray, labels: np.ndarray, lam: float, r_y: int, r_x: int):
    H, W = images.shape[1:3]
    r = 0.5 * math.sqrt(1.0 - lam)
    r_w_half, r_h_half = int(r * W), int(r * H)
    x1, y1 = max(r_x - r_w_half, 0), max(r_y - r_h_half, 0)
    x2, y2 = min(r_x + r_w_half, W), min(r_y + r_h_half, H)
    lam_adjusted = float(1.0 - (x2 - x1) * (y2 - y1) / (W * H))
    out = images.copy()
    out[:, y1:y2, x1:x2] = np.roll(images, 1, 0)[:, y1:y2, x1:x2]
    return out, _tv_mixup_label(labels, lam_adjusted)


@pytest.fixture(scope="module")
def batch():
    """A global batch of 16 images of 12x20 over 8 devices, as a loader hands it out."""
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (16, 12, 20, 3), dtype=np.uint8)
    labels = rng.integers(0, CLASSES, 16).astype(np.int32)
    sharding = meshfeed.batch_sharding(meshfeed.make_mesh(data=8))
    return images, labels, jax.device_put(images, sharding), jax.device_put(labels, sharding)


def test_normalize_is_torchvisions_to_dtype_then_normalize(batch):
    images, _, placed, _ = batch
    out = jax.jit(vision.normalize)(placed)
    want = _tv_normalize(images, vision.IMAGENET_MEAN, vision.IMAGENET_STD)
    np.testing.assert_allclose(np.asarray(out), want, rtol=0, atol=1e-6)
    assert out.dtype == jnp.float32 and out.sharding.is_equivalent_to(placed.sharding, 4)
    half = vision.normalize(placed, 0.5, 0.25, dtype=jnp.bfloat16)
    assert half.dtype == jnp.bfloat16
    with pytest.raises(ValueError, match="one value per channel"):
        vision.normalize(placed, (0.5, 0.5), (0.2, 0.2))


def test_mixup_and_cutmix_mix_as_torchvision_does_under_jit_on_8_devices(batch):
    _, labels, placed, placed_labels = batch
    x = vision.normalize(placed)
    floats = np.asarray(x)  # the same input both ways (normalize's own test is above)
    seen = {True: 0, False: 0}

    @jax.jit
    def step(key, x, labels):
        params = vision.mix_params(key, 12, 20)
        return params, vision.mix_batch(x, labels, CLASSES, params)

    for i in range(12):
        params, (out, soft) = step(jax.random.key(i), x, placed_labels)
        cut, lam = bool(params.cut), float(params.lam)
        seen[cut] += 1
        if cut:
            r_y, r_x = (int(c) for c in params.center)
            want, want_soft = _tv_cutmix(floats, labels, lam, r_y, r_x)
            np.testing.assert_array_equal(np.asarray(out), want)  # pixels moved, not mixed
        else:
            want, want_soft = _tv_mixup(floats, labels, lam)
            np.testing.assert_allclose(np.asarray(out), want, rtol=0, atol=2e-6)
        np.testing.assert_allclose(np.asarray(soft), want_soft, rtol=0, atol=1e-6)
        assert out.sharding.is_equivalent_to(placed.sharding, 4)
        assert soft.sharding.spec[0] == placed_labels.sharding.spec[0]  # rows stay put
    assert seen[True] and seen[False]  # both ways taken in 12 draws
    # One way alone: MixUp's and CutMix's own functions.
    mixup = jax.jit(lambda k, x, y: vision.mixup(k, x, y, CLASSES, alpha=0.2))
    cutmix = jax.jit(lambda k, x, y: vision.cutmix(k, x, y, CLASSES))
    out, soft = mixup(jax.random.key(3), x, placed_labels)
    np.testing.assert_allclose(np.asarray(soft).sum(1), 1.0, rtol=1e-6)
    out, soft = cutmix(jax.random.key(3), x, placed_labels)
    moved = np.asarray(out) != np.asarray(x)
    assert moved.any() and np.isin(np.asarray(out), np.asarray(x)).all()


def test_the_draws_follow_torchvisions_distributions():
    """Beta(alpha, alpha) weights, even odds between MixUp and CutMix, box centres uniform
    over the pixels (a seeded check: these keys pass, and would fail a wrong law)."""
    keys = jax.random.split(jax.random.key(7), 4000)
    draw = jax.jit(jax.vmap(lambda k: vision.mix_params(k, 12, 20, mixup_alpha=0.2)))
    params = draw(keys)
    cut, lam = np.asarray(params.cut), np.asarray(params.lam, np.float64)
    assert stats.binomtest(int(cut.sum()), len(cut), 0.5).pvalue > 1e-3
    assert stats.kstest(lam[~cut], stats.beta(0.2, 0.2).cdf).pvalue > 1e-3
    assert stats.kstest(lam[cut], stats.beta(1.0, 1.0).cdf).pvalue > 1e-3
    assert stats.kstest(lam[~cut], stats.beta(1.0, 1.0).cdf).pvalue < 1e-6  # it can tell
    assert stats.kstest(lam[cut], stats.beta(0.2, 0.2).cdf).pvalue < 1e-6
    for axis, side in ((0, 12), (1, 20)):
        counts = np.bincount(np.asarray(params.center[axis]), minlength=side)
        assert len(counts) == side and stats.chisquare(counts).pvalue > 1e-3
    alone = jax.vmap(lambda k: vision.mix_params(k, 12, 20, mixup_alpha=0.0))(keys[:100])
    assert np.asarray(alone.cut).all()


def test_a_steps_mixing_is_the_same_on_any_mesh(batch):
    images, labels, placed, placed_labels = batch
    one = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    key = jax.random.key(5)
    mix = jax.jit(lambda k, x, y: vision.mixup_or_cutmix(k, vision.normalize(x), y, CLASSES))
    a = mix(key, placed, placed_labels)
    b = mix(key, jax.device_put(images, one), jax.device_put(labels, one))
    for got, want in zip(a, b, strict=True):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


def test_bad_input_is_named(batch):
    _, _, placed, placed_labels = batch
    with pytest.raises(ValueError, match="both 0"):
        vision.mix_params(jax.random.key(0), 4, 4, mixup_alpha=0, cutmix_alpha=0)
    with pytest.raises(ValueError, match="cutmix_alpha=-1"):
        vision.mix_params(jax.random.key(0), 4, 4, cutmix_alpha=-1)
    with pytest.raises(ValueError, match=r"\[batch, height, width, channels\]"):
        vision.mixup(jax.random.key(0), placed[0], placed_labels, CLASSES)
    with pytest.raises(ValueError, match="one class index an image"):
        vision.cutmix(jax.random.key(0), placed, placed_labels[:4], CLASSES)


def _tv_erasing_params(generator, img_h, img_w, p=0.5, scale=(0.02, 0.33), ratio=(0.3, 3.3)):
    """torchvision v2's RandomErasing draws (``_RandomApplyTransform.forward``'s p check,
    then ``make_params``), written out with torch's own generator."""
    if torch.rand(1, generator=generator) >= p:
        return None
    area = img_h * img_w
    log_ratio = torch.log(torch.tensor(ratio))
    for _ in range(10):
        erase_area = area * torch.empty(1).uniform_(scale[0], scale[1], generator=generator).item()
        aspect_ratio = torch.exp(
            torch.empty(1).uniform_(log_ratio[0], log_ratio[1], generator=generator)  # type: ignore[arg-type]
        ).item()
        h = round(math.sqrt(erase_area * aspect_ratio))  # int(round(...)) there
        w = round(math.sqrt(erase_area / aspect_ratio))
        if not (h < img_h and w < img_w):
            continue
        i = torch.randint(0, img_h - h + 1, size=(1,), generator=generator).item()
        j = torch.randint(0, img_w - w + 1, size=(1,), generator=generator).item()
        return i, j, h, w
    return None


def test_random_erasing_is_torchvisions_on_8_devices(batch):
    _, _, placed, _ = batch
    x = vision.normalize(placed)
    erase = jax.jit(lambda k, x: vision.random_erasing(k, x, p=0.9, value=(0.5, -1.0, 2.0)))
    boxes = jax.jit(lambda k: vision.erasing_params(jax.random.split(k)[0], 16, 12, 20, p=0.9))
    for seed in range(3):
        out = erase(jax.random.key(seed), x)
        assert out.sharding.is_equivalent_to(x.sharding, 4)
        want = np.array(x)
        top, left, h, w = (np.asarray(v) for v in boxes(jax.random.key(seed)))
        for n in range(16):  # erase_image: image[..., i : i + h, j : j + w] = v
            want[n, top[n] : top[n] + h[n], left[n] : left[n] + w[n]] = (0.5, -1.0, 2.0)
        np.testing.assert_array_equal(np.asarray(out), want)
    noisy = vision.random_erasing(jax.random.key(0), x, p=1.0, value="random")
    assert (np.asarray(noisy) != np.asarray(x)).any()


def test_random_erasing_draws_as_torchvision_does():
    """Two samples of 3000 boxes on 24x32 images, torchvision's draws with torch's
    generator and ours, agree in law (a seeded check that tells p=0.5 from p=0.4)."""
    generator = torch.Generator().manual_seed(0)
    theirs = [_tv_erasing_params(generator, 24, 32) for _ in range(3000)]
    ours = jax.jit(lambda k: vision.erasing_params(k, 3000, 24, 32))(jax.random.key(0))
    erased = np.asarray(ours.height) > 0
    assert stats.binomtest(int(erased.sum()), 3000, 0.5).pvalue > 1e-3
    assert stats.binomtest(int(erased.sum()), 3000, 0.4).pvalue < 1e-6
    kept = [b for b in theirs if b is not None]
    for field, at in (("top", 0), ("left", 1), ("height", 2), ("width", 3)):
        mine = np.asarray(getattr(ours, field))[erased]
        assert stats.ks_2samp(mine, [b[at] for b in kept]).pvalue > 1e-3, field
    with pytest.raises(ValueError, match="p=2"):
        vision.erasing_params(jax.random.key(0), 2, 8, 8, p=2)
