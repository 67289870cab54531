"""``meshfeed index``: its flags, and the one call it makes (``meshfeed.index``)."""

from __future__ import annotations

import argparse
from typing import Any

from meshfeed._cli.flags import fail

EPILOG = """examples:
  meshfeed index 'shards/shard-{000..127}.tar'
  meshfeed index 's3://bucket/wds/*.tar' --endpoint-url http://127.0.0.1:9000 --part 0/4
  meshfeed index '/shared/wds/*.tar' --ray         (a Ray task per file, on the cluster)
  meshfeed index chat.jsonl.gz --seekable          (rewrite in members of 1 MiB first)
  meshfeed index 'wds/*.tgz' --seekable            (a restart point every 1 MiB first)
  meshfeed index /readonly/data/*.tfrecord --index-dir ~/indexes
"""


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "index",
        help="index WebDataset tar shards, JSON Lines or TFRecord files for random access",
        description="Scans each file once and writes a small sidecar of byte offsets, so "
        "meshfeed.sources.TarSource, JsonlSource and TFRecordSource read any sample by range. "
        "Files already indexed (and unchanged) are skipped: run it again to finish.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("files", nargs="+", help="paths, globs, brace patterns or URLs")
    p.add_argument("--index-dir", default=None, help="write the indexes here, not beside the files")
    p.add_argument("--workers", type=int, default=None, help="processes (default: cores)")
    p.add_argument("--part", default=None, help="i/N: index only share i of N of the files")
    p.add_argument(
        "--ray",
        action="store_true",
        help="index the files as Ray tasks, one a file: on the cluster RAY_ADDRESS names, "
        "or a local Ray",
    )
    p.add_argument(
        "--seekable",
        action="store_true",
        help="rewrite compressed files of one large member (.jsonl.gz, .tgz, "
        ".tar.zst, .tfrecord.gz) seekable first: a restart point every 1 MiB, "
        "still one valid stream for any tool",
    )
    p.add_argument("--endpoint-url", default=None, help="an S3-compatible store's endpoint")
    p.add_argument("--quiet", action="store_true", help="no line per file")


def run(args: argparse.Namespace) -> int:
    import meshfeed

    part = None
    if args.part is not None:
        i, _, n = args.part.partition("/")
        if not (i.isdigit() and n.isdigit()) or not int(i) < int(n):
            fail(f"--part {args.part}: write i/N with 0 <= i < N, e.g. --part 0/4.")
        part = (int(i), int(n))
    report = meshfeed.index(
        args.files,
        index_dir=args.index_dir,
        workers=args.workers,
        part=part,
        executor="ray" if args.ray else "local",
        seekable=args.seekable,
        storage_options={"endpoint_url": args.endpoint_url} if args.endpoint_url else None,
        progress=not args.quiet,
    )
    print(report)
    return 0
