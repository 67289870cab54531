"""``meshfeed shard``: its flags, and the call it makes (``meshfeed.vision.shard_images``)."""

from __future__ import annotations

import argparse
from typing import Any

EPILOG = """examples:
  meshfeed shard imagenet/train imagenet-shards/train --workers 8
  meshfeed shard s3://bucket/imagenet/train s3://bucket/shards/train \
      --endpoint-url http://127.0.0.1:9000 --ray
  meshfeed shard imagenet/train shards/train --part-bytes 536870912 --seed 1
"""


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "shard",
        help="write an image folder (a subfolder per class) as shards read by range",
        description="Writes every image of a folder -- its bytes unchanged, its label, its "
        "id in the folder, the class list -- as a meshfeed folder of parts that "
        "open_source reads by range: from object storage, a few long reads a step instead "
        "of a request an image. Resumable: run it again to finish a killed build.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("images", help="the image folder: a path or URL, a subfolder per class")
    p.add_argument("out", help="the folder to write (a path or URL)")
    p.add_argument(
        "--part-bytes",
        type=int,
        default=256 << 20,
        help="image bytes a part (one shard file) holds (default 256 MiB)",
    )
    p.add_argument(
        "--in-order",
        action="store_true",
        help="write the images in the folder's order, not a keyed random one",
    )
    p.add_argument("--seed", type=int, default=0, help="the key of the written order")
    p.add_argument(
        "--workers",
        type=int,
        default=None,
        help="local processes (default: cores; 0: this process)",
    )
    p.add_argument("--ray", action="store_true", help="write the parts as Ray tasks")
    p.add_argument("--endpoint-url", default=None, help="an S3-compatible store's endpoint")
    p.add_argument("--quiet", action="store_true", help="no progress output")


def run(args: argparse.Namespace) -> int:
    from meshfeed.vision import shard_images

    status = shard_images(
        args.images,
        args.out,
        part_bytes=args.part_bytes,
        shuffle=not args.in_order,
        seed=args.seed,
        workers=args.workers,
        executor="ray" if args.ray else "local",
        storage_options={"endpoint_url": args.endpoint_url} if args.endpoint_url else None,
        progress=not args.quiet,
    )
    rate = f", {status.images_per_s:,.0f} images/s" if status.ran else ""
    print(
        f"{status} (this run wrote {status.ran} parts: {status.images:,} images, "
        f"{status.image_bytes / 2**20:,.1f} MiB in {status.seconds:.1f} s{rate})"
    )
    return 0
