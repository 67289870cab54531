"""``meshfeed pack``: its flags, and the one call it makes (``meshfeed.pack``)."""

from __future__ import annotations

import argparse
import json
import os
from typing import Any, get_args

from meshfeed.types import Algorithm

EPILOG = """examples:
  meshfeed pack tokens/ --seq-len 2048          (the plan in tokens/meshfeed.pack/)
  meshfeed pack s3://bucket/tokens --seq-len 4096 --endpoint-url http://127.0.0.1:9000
  meshfeed pack /readonly/tokens --seq-len 2048 --plan-dir /shared/plans
  meshfeed pack s3://bucket/tokens --seq-len 2048 --ray   (a Ray task per shard of the plan)
"""


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "pack",
        help="build the packing plan of a folder of documents ahead of a run",
        description="Plans once which pieces of which documents go in each packed row and "
        "keeps the plan beside the data (or in --plan-dir), where every host's "
        "meshfeed.pack(open_source(DATA), SEQ_LEN, ...) with the same settings reads it "
        "by range instead of planning. Pass the settings the run will use.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("data", help="a meshfeed folder of documents (a path or URL)")
    p.add_argument("--seq-len", type=int, required=True, help="tokens per packed row")
    p.add_argument("--field", default="tokens", help="the field packed (default: tokens)")
    p.add_argument("--seed", type=int, default=0, help="the order's key (default: 0)")
    p.add_argument("--algorithm", default="best_fit", choices=list(get_args(Algorithm)))
    p.add_argument(
        "--window",
        type=int,
        default=None,
        help="documents planned together (default: the algorithm's)",
    )
    p.add_argument("--long-docs", default=None, choices=["split", "truncate", "drop", "error"])
    p.add_argument("--max-segments", type=int, default=None, help="documents a row at most")
    p.add_argument("--plan-dir", default=None, help="keep the plan here, not beside the data")
    p.add_argument("--rebuild", action="store_true", help="build it again over the one there")
    p.add_argument(
        "--workers",
        type=int,
        default=os.cpu_count() or 1,
        help="processes that build it (default: cores)",
    )
    p.add_argument("--ray", action="store_true", help="a Ray task per shard, on the cluster")
    p.add_argument("--endpoint-url", default=None, help="an S3-compatible store's endpoint")


def run(args: argparse.Namespace) -> int:
    import meshfeed

    options = {"endpoint_url": args.endpoint_url} if args.endpoint_url else None
    packed = meshfeed.pack(
        meshfeed.open_source(args.data, storage_options=options),
        args.seq_len,
        field=args.field,
        seed=args.seed,
        algorithm=args.algorithm,
        window=args.window,
        long_docs=args.long_docs,
        max_segments=args.max_segments,
        plan_dir=args.plan_dir,
        rebuild_plan=args.rebuild,
        plan_workers=max(1, args.workers),
        plan_executor="ray" if args.ray else "local",
    )
    where = getattr(packed.plan, "where", None)
    print(json.dumps({"plan": where, **packed.stats()}))
    return 0 if where is not None else 1
