"""The ``meshfeed`` command. Each subcommand parses its flags and calls one function."""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Sequence

from meshfeed._cli.flags import (
    SPEC_HELP,
    check_layout,
    cpu_devices,
    fail,
    parse_mesh,
    parse_shape,
    parse_spec,
)
from meshfeed._cli.index import add_parser as add_index_parser
from meshfeed._cli.pack import add_parser as add_pack_parser
from meshfeed._cli.prepare import add_parser as add_prepare_parser
from meshfeed._cli.shard import add_parser as add_shard_parser

EXAMPLES = """examples:
  meshfeed show --mesh data=4,model=2 --spec data,model --shape 256,128
  meshfeed show --mesh data=4,model=2 --spec data --shape 256,784 --processes 2 --out layout.png
  meshfeed plan --mesh data=4,model=2 --spec data --shape 256,784 --dtype uint8 --processes 2
  meshfeed plan --mesh data=8 --spec data --data s3://bucket/ds --batch 256 --shuffle-block 1024
  meshfeed launch -n 2 --devices-per-process 4 -- python examples/train.py --epochs 3
  meshfeed prepare 'corpus/*.jsonl' --tokenizer tokenizer.json --out tokens --workers 2
  meshfeed index 'shards/shard-{000..127}.tar'
  meshfeed pack tokens/ --seq-len 2048
  meshfeed shard imagenet/train s3://bucket/shards/train --endpoint-url http://127.0.0.1:9000
  meshfeed demo            (or: meshfeed demo --keras, meshfeed demo --lm)
  meshfeed bench loader --shape 28,28,1 --dtype uint8 --batch 256
"""


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="meshfeed",
        description="Feed JAX device meshes: global sharded batches on one process or many.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True)

    def layout_flags(p: argparse.ArgumentParser, shape_required: bool = True) -> None:
        p.add_argument("--mesh", type=parse_mesh, required=True, help="e.g. data=4,model=2")
        p.add_argument("--spec", type=parse_spec, required=True, help=SPEC_HELP)
        p.add_argument(
            "--shape", type=parse_shape, required=shape_required, help="global shape: 256,128"
        )
        p.add_argument("--dtype", default="float32", help="element type (default float32)")
        p.add_argument(
            "--processes",
            type=int,
            default=None,
            help="label as if the devices were split over N processes",
        )

    show = sub.add_parser(
        "show",
        help="draw a layout as text (and a PNG/SVG with --out)",
        epilog="example: meshfeed show --mesh data=4,model=2 --spec data,model --shape 256,128",
    )
    layout_flags(show)
    show.add_argument("--out", default=None, help="also draw to this .png or .svg")

    plan = sub.add_parser(
        "plan",
        help="what each loading strategy reads and moves, and what auto picks",
        epilog="example: meshfeed plan --mesh data=4,model=2 --spec data --shape 256,784 "
        "--dtype uint8 --processes 2",
    )
    layout_flags(plan, shape_required=False)
    plan.add_argument(
        "--data",
        default=None,
        help="plan a loader over this dataset (a folder, files or a URL, e.g. s3://bucket/ds) "
        "instead of --shape: also the requests and bytes each step fetches, and with "
        "--processes N what N hosts ask of the store (start-up and each step)",
    )
    plan.add_argument("--batch", type=int, default=256, help="with --data: global batch size")
    plan.add_argument("--shuffle-block", type=int, default=None, help="with --data")
    plan.add_argument("--shuffle-window", type=int, default=None, help="with --data")
    plan.add_argument(
        "--endpoint-url", default=None, help="with --data: the store's endpoint (S3-compatible)"
    )
    plan.add_argument(
        "--store-rps",
        type=float,
        default=5500.0,
        help="with --data: the store's requests a second, for the pod's figures (default "
        "5500, S3's per prefix)",
    )

    launch = sub.add_parser(
        "launch",
        help="run a command as N connected local processes",
        description="Starts N copies of COMMAND on 127.0.0.1, wired so that "
        "meshfeed.initialize() connects them; prefixes output with the process index; "
        "stops all when one fails.",
        epilog="example: meshfeed launch -n 2 --devices-per-process 4 -- python examples/train.py",
    )
    launch.add_argument("-n", "--processes", type=int, default=2, help="processes (default 2)")
    launch.add_argument("--devices-per-process", type=int, default=4, help="CPU devices each")
    launch.add_argument("--timeout", type=float, default=None, help="seconds before stopping")
    launch.add_argument(
        "--port", type=int, default=None, help="coordinator port (default: a free one)"
    )
    launch.add_argument("cmd", nargs=argparse.REMAINDER, help="-- COMMAND [ARGS...]")

    add_prepare_parser(sub)
    add_index_parser(sub)
    add_pack_parser(sub)
    add_shard_parser(sub)

    demo = sub.add_parser(
        "demo",
        help="train a small convnet on scikit-learn's digits, data-parallel on local processes",
        description="Trains a small convnet on scikit-learn's handwritten digits on N local "
        "processes x M CPU devices, fed by meshfeed, and prints the test accuracy.",
    )
    demo.add_argument("--processes", type=int, default=2, help="local processes (default 2)")
    demo.add_argument(
        "--devices-per-process", type=int, default=4, help="CPU devices each (default 4)"
    )
    demo.add_argument("--steps", type=int, default=None, help="the LM demo's steps (default 300)")
    demo.add_argument(
        "--epochs", type=int, default=None, help="the Keras demo's epochs (default 8)"
    )
    demo.add_argument(
        "--keras",
        action="store_true",
        help="train the Keras multi-device guide's convnet with meshfeed.keras.fit",
    )
    demo.add_argument(
        "--lm",
        action="store_true",
        help="train a byte-level transformer on packed documents of Python's standard library",
    )

    bench = sub.add_parser(
        "bench",
        help="time every loading strategy (or matmul strategy) on your shapes",
        epilog="examples: meshfeed bench loader --shape 2048 --dtype int32 --batch 64; "
        "meshfeed bench matmul --size 4096 --mesh data=4,model=2",
    )
    bench.add_argument("what", choices=["loader", "matmul"], help="what to time")
    bench.add_argument("--size", type=int, default=4096, help="matmul: square matrix size")
    bench.add_argument("--repeats", type=int, default=5, help="matmul: timed runs, median")
    bench.add_argument(
        "--layouts", action="store_true", help="matmul: also draw each strategy's layouts"
    )
    bench.add_argument("--shape", type=parse_shape, default=(28, 28, 1), help="per example")
    bench.add_argument("--dtype", default="uint8")
    bench.add_argument("--examples", type=int, default=20_000)
    bench.add_argument("--batch", type=int, default=256, help="global batch size")
    bench.add_argument("--mesh", type=parse_mesh, default=None, help="default data=<devices>")
    bench.add_argument("--seconds", type=float, default=1.0, help="timing per entry")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        return _run(args)
    except (ValueError, TypeError, FileNotFoundError, FileExistsError) as error:  # refused input
        fail(str(error).splitlines()[0])


def _run(args: argparse.Namespace) -> int:
    if args.command in ("show", "plan"):
        import meshfeed
        from meshfeed._cli.flags import sharding_from_flags

        # With --data, --processes is the pod's hosts, not a split of --mesh's devices.
        pod = args.command == "plan" and args.data is not None
        check_layout(args.mesh, args.spec, args.shape, None if pod else args.processes)
        sharding = sharding_from_flags(args.mesh, args.spec)
        if args.command == "plan":
            if args.data is not None:
                from meshfeed._cli.flags import plan_data

                print(meshfeed.show_plan(plan_data(args, sharding)), end="")
                return 0
            if args.shape is None:
                fail("plan needs --shape (or --data).")
            plan = meshfeed.inspect.plan(sharding, args.shape, args.dtype, processes=args.processes)
            print(meshfeed.show_plan(plan), end="")
            return 0
        meshfeed.show_sharding(sharding, shape=args.shape, processes=args.processes)
        if args.out:
            path = meshfeed.inspect.plot_sharding(
                sharding, args.out, shape=args.shape, processes=args.processes
            )
            print(f"wrote {path}")
        return 0
    if args.command == "launch":
        from meshfeed.cluster._launch import launch

        cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
        if not cmd:
            fail("launch needs the command after --, e.g. -- python examples/train.py")
        return launch(
            cmd,
            num_processes=args.processes,
            devices_per_process=args.devices_per_process,
            timeout_s=args.timeout,
            port=args.port,
        )
    if args.command == "index":
        from meshfeed._cli.index import run as run_index

        return run_index(args)
    if args.command == "pack":
        from meshfeed._cli.pack import run as run_pack

        return run_pack(args)
    if args.command == "prepare":
        from meshfeed._cli.prepare import run

        return run(args)
    if args.command == "shard":
        from meshfeed._cli.shard import run as run_shard

        return run_shard(args)
    if args.command == "demo":
        from meshfeed._cli.demo import run_demo

        return run_demo(
            num_processes=args.processes,
            devices_per_process=args.devices_per_process,
            keras=args.keras,
            lm=args.lm,
            steps=args.steps,
            epochs=args.epochs,
        )
    if args.mesh:  # bench
        if args.what == "loader" and args.batch % next(iter(args.mesh.values())):
            fail(
                f"--batch {args.batch} does not split over {next(iter(args.mesh))}="
                f"{next(iter(args.mesh.values()))}; pass a multiple of it."
            )
        devices = math.prod(args.mesh.values())
        if args.what == "matmul" and args.size % devices:
            fail(f"--size {args.size} must be a multiple of the mesh's {devices} devices.")
        cpu_devices(math.prod(args.mesh.values()))
    if args.what == "matmul":
        from meshfeed._cli.bench_matmul import report_matmul

        return report_matmul(
            size=args.size, mesh=args.mesh, repeats=args.repeats, layouts=args.layouts
        )
    from meshfeed._cli.bench import report_loader

    return report_loader(
        shape=args.shape,
        dtype=args.dtype,
        examples=args.examples,
        global_batch_size=args.batch,
        mesh=args.mesh,
        seconds=args.seconds,
    )


if __name__ == "__main__":
    sys.exit(main())
