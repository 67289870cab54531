"""Images: torchvision's training and eval crops as record work, decoded by Pillow or by
nvImageCodec -- on a GPU host its hardware JPEG decoders.

The training and eval pipelines of ImageNet models as torchvision makes them (the crop,
and after it ``TrivialAugmentWide``, ``RandAugment``, ``ColorJitter``), as record
transforms any loader runs in its workers (seeded by seed, epoch and example, so a run
and its resume see the same crops)::

    loader = meshfeed.Loader(
        meshfeed.ImageFolderSource("train/"), global_batch_size=256, sharding=sharding,
        record_transform=meshfeed.vision.RandomResizedCrop(224), num_workers=14)

On a GPU host the JPEG decode can move to the GPU's decoders, a chunk of records at a
time, each decoded in its crop only: ``RandomResizedCrop(224, decoder="auto")`` (the
``gpu-decode`` extra), with the same crops. The output is ``uint8`` ``[size, size,
3]``; normalise on the device, in the step: ``normalize``, MixUp and CutMix
(``mixup_or_cutmix``) and ``random_erasing`` run on the global batch as it is sharded.
Pillow is the ``vision`` extra. ``shard_images`` writes an image folder as shards read by
range, for object storage (``meshfeed shard`` on the command line).

Modules, lowest first (each imports only modules listed before it)::

    _crop          where an image is cut: torchvision's RandomResizedCrop, Resize, CenterCrop
    _nvimgcodec    crops of a chunk of images decoded at once on nvImageCodec (GPU or CPU)
    _pil_ops       torchvision v2's image operations on Pillow images (the same calls)
    _auto_augment  TrivialAugmentWide, RandAugment, ColorJitter: draws and Pillow ops
    _augment       RandomResizedCrop and CenterCrop as record transforms (Pillow, nvImageCodec)
    _mix           the batch's augmentations on the devices: normalize, MixUp, CutMix
    _erase         RandomErasing on the devices, a box an image
"""

from meshfeed.prepare._shard_images import ShardStatus as ShardStatus
from meshfeed.prepare._shard_images import shard_images as shard_images
from meshfeed.vision._augment import CenterCrop as CenterCrop
from meshfeed.vision._augment import Decoder as Decoder
from meshfeed.vision._augment import RandomResizedCrop as RandomResizedCrop
from meshfeed.vision._augment import decode as decode
from meshfeed.vision._augment import image_size as image_size
from meshfeed.vision._auto_augment import ColorJitter as ColorJitter
from meshfeed.vision._auto_augment import RandAugment as RandAugment
from meshfeed.vision._auto_augment import TrivialAugmentWide as TrivialAugmentWide
from meshfeed.vision._crop import Box as Box
from meshfeed.vision._crop import center_crop as center_crop
from meshfeed.vision._crop import random_resized_crop as random_resized_crop
from meshfeed.vision._crop import resize_shorter as resize_shorter
from meshfeed.vision._erase import EraseBoxes as EraseBoxes
from meshfeed.vision._erase import erasing_params as erasing_params
from meshfeed.vision._erase import random_erasing as random_erasing
from meshfeed.vision._mix import IMAGENET_MEAN as IMAGENET_MEAN
from meshfeed.vision._mix import IMAGENET_STD as IMAGENET_STD
from meshfeed.vision._mix import MixParams as MixParams
from meshfeed.vision._mix import cutmix as cutmix
from meshfeed.vision._mix import mix_batch as mix_batch
from meshfeed.vision._mix import mix_params as mix_params
from meshfeed.vision._mix import mixup as mixup
from meshfeed.vision._mix import mixup_or_cutmix as mixup_or_cutmix
from meshfeed.vision._mix import normalize as normalize

__all__ = [
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "Box",
    "CenterCrop",
    "ColorJitter",
    "Decoder",
    "EraseBoxes",
    "MixParams",
    "RandAugment",
    "RandomResizedCrop",
    "ShardStatus",
    "TrivialAugmentWide",
    "center_crop",
    "cutmix",
    "decode",
    "erasing_params",
    "image_size",
    "mix_batch",
    "mix_params",
    "mixup",
    "mixup_or_cutmix",
    "normalize",
    "random_erasing",
    "random_resized_crop",
    "resize_shorter",
    "shard_images",
]
