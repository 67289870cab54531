"""The ``meshfeed`` command. Each subcommand parses its flags and calls one public function."""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import sys
from collections.abc import Sequence
from typing import Any

EXAMPLES = """examples:
  meshfeed show --mesh data=4,model=2 --spec data,model --shape 256,128
  meshfeed show --mesh data=4,model=2 --spec data --shape 256,784 --processes 2 --out layout.png
  meshfeed plan --mesh data=4,model=2 --spec data --shape 256,784 --dtype uint8 --processes 2
  meshfeed launch -n 2 --devices-per-process 4 -- python train.py --epochs 3
  meshfeed demo            (or: meshfeed demo --keras)
  meshfeed bench loader --shape 28,28,1 --dtype uint8 --batch 256
"""

SPEC_HELP = (
    "PartitionSpec, one entry per dimension separated by commas; join mesh axes on one "
    "dimension with '+', and write 'none' for an unsplit dimension: data,model | "
    "data+model | none,data"
)


def parse_mesh(text: str) -> dict[str, int]:
    """``"data=4,model=2"`` -> ``{"data": 4, "model": 2}``."""
    axes: dict[str, int] = {}
    for part in text.split(","):
        name, _, size = part.partition("=")
        if not name or not size.lstrip("-").isdigit():
            raise argparse.ArgumentTypeError(
                f"--mesh {text!r}: write axis=size pairs separated by commas, e.g. data=4,model=2"
            )
        axes[name.strip()] = int(size)
    return axes


def parse_spec(text: str) -> tuple[Any, ...]:
    """``"data+model,none"`` -> ``(("data", "model"), None)``."""
    entries: list[Any] = []
    for part in text.split(","):
        part = part.strip()
        if part.lower() in ("", "none", "-"):
            entries.append(None)
        elif "+" in part:
            entries.append(tuple(a.strip() for a in part.split("+")))
        else:
            entries.append(part)
    return tuple(entries)


def parse_shape(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(d) for d in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--shape {text!r}: write sizes like 256,128") from None


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="meshfeed",
        description="Feed JAX device meshes: global sharded batches on one process or many.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True)

    def layout_flags(p: argparse.ArgumentParser) -> None:
        p.add_argument("--mesh", type=parse_mesh, required=True, help="e.g. data=4,model=2")
        p.add_argument("--spec", type=parse_spec, required=True, help=SPEC_HELP)
        p.add_argument("--shape", type=parse_shape, required=True, help="global shape: 256,128")
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
    layout_flags(plan)

    launch = sub.add_parser(
        "launch",
        help="run a command as N connected local processes",
        description="Starts N copies of COMMAND on 127.0.0.1, wired so that "
        "meshfeed.initialize() connects them; prefixes output with the process index; "
        "stops all when one fails.",
        epilog="example: meshfeed launch -n 2 --devices-per-process 4 -- python train.py",
    )
    launch.add_argument("-n", "--processes", type=int, default=2, help="processes (default 2)")
    launch.add_argument("--devices-per-process", type=int, default=4, help="CPU devices each")
    launch.add_argument("--timeout", type=float, default=None, help="seconds before stopping")
    launch.add_argument(
        "--port", type=int, default=None, help="coordinator port (default: a free one)"
    )
    launch.add_argument("cmd", nargs=argparse.REMAINDER, help="-- COMMAND [ARGS...]")

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
    demo.add_argument(
        "--keras",
        action="store_true",
        help="train the Keras multi-device guide's convnet with meshfeed.keras.KerasTrainer",
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
    bench.add_argument("--shape", type=parse_shape, default=(28, 28, 1), help="per example")
    bench.add_argument("--dtype", default="uint8")
    bench.add_argument("--examples", type=int, default=20_000)
    bench.add_argument("--batch", type=int, default=256, help="global batch size")
    bench.add_argument("--mesh", type=parse_mesh, default=None, help="default data=<devices>")
    bench.add_argument("--seconds", type=float, default=1.0, help="timing per entry")
    return parser


def _cpu_devices(count: int) -> None:
    """Simulates ``count`` CPU devices, before JAX starts its backend (CPU only)."""
    import jax

    # If JAX already started in this process, it keeps the devices it has.
    with contextlib.suppress(RuntimeError):
        jax.config.update("jax_num_cpu_devices", count)


def _sharding(args: argparse.Namespace) -> Any:
    from jax.sharding import NamedSharding, PartitionSpec

    import meshfeed

    _cpu_devices(math.prod(args.mesh.values()))
    mesh = meshfeed.make_mesh(**args.mesh)
    missing = {a for e in args.spec if e for a in ((e,) if isinstance(e, str) else e)}
    missing -= set(mesh.axis_names)
    if missing:
        raise SystemExit(f"meshfeed: --spec names {sorted(missing)}, not axes of --mesh.")
    return NamedSharding(mesh, PartitionSpec(*args.spec))


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "show":
        import meshfeed

        sharding = _sharding(args)
        print(meshfeed.show_sharding(sharding, shape=args.shape, processes=args.processes), end="")
        if args.out:
            path = meshfeed.plot_sharding(
                sharding, args.out, shape=args.shape, processes=args.processes
            )
            print(f"wrote {path}")
        return 0
    if args.command == "plan":
        import meshfeed

        sharding = _sharding(args)
        print(meshfeed.plan(sharding, args.shape, args.dtype, processes=args.processes), end="")
        return 0
    if args.command == "launch":
        from meshfeed._launch import launch

        cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
        if not cmd:
            raise SystemExit("meshfeed launch: give the command after --, e.g. -- python train.py")
        return launch(
            cmd,
            num_processes=args.processes,
            devices_per_process=args.devices_per_process,
            timeout_s=args.timeout,
            port=args.port,
        )
    if args.command == "demo":
        from meshfeed._demo import run_demo

        return run_demo(
            num_processes=args.processes,
            devices_per_process=args.devices_per_process,
            keras=args.keras,
        )
    if args.command == "bench":
        if args.mesh:
            _cpu_devices(math.prod(args.mesh.values()))
        import meshfeed

        if args.what == "matmul":
            from meshfeed._bench_matmul import bench_matmul, table

            rows, pictures = bench_matmul(size=args.size, mesh=args.mesh, repeats=args.repeats)
            for strategy, picture in pictures.items():
                print(f"== {strategy}\n{picture}")
            print(table(rows))
            for line in rows:
                print(json.dumps({"benchmark": "matmul", "size": args.size, **line}))
            return 0
        for line in meshfeed.bench_loader(
            shape=args.shape,
            dtype=args.dtype,
            examples=args.examples,
            global_batch_size=args.batch,
            mesh=args.mesh,
            seconds=args.seconds,
        ):
            print(json.dumps(line))
        return 0
    return 2  # pragma: no cover - argparse rejects unknown commands


if __name__ == "__main__":
    sys.exit(main())
