"""The ``meshfeed`` command. Each subcommand calls one public function."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="meshfeed",
        description="Feed JAX device meshes: global sharded batches on one process or many.",
        epilog="example: meshfeed demo --processes 2 --devices-per-process 4",
    )
    sub = parser.add_subparsers(dest="command", required=True)
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
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "demo":
        from meshfeed._demo import run_demo

        return run_demo(
            num_processes=args.processes,
            devices_per_process=args.devices_per_process,
            keras=args.keras,
        )
    return 2  # pragma: no cover - argparse rejects unknown commands


if __name__ == "__main__":
    sys.exit(main())
