"""Flags of the ``meshfeed`` command: meshes, specs and shapes written as text."""

from __future__ import annotations

import argparse
import contextlib
import math
import sys
from typing import Any, NoReturn

SPEC_HELP = (
    "PartitionSpec, one entry per dimension separated by commas; join mesh axes on one "
    "dimension with '+', and write 'none' for an unsplit dimension: data,model | "
    "data+model | none,data"
)


def fail(message: str) -> NoReturn:
    """Ends the command with one line on stderr and exit code 2 (a usage error)."""
    print(f"meshfeed: error: {message}", file=sys.stderr, flush=True)
    raise SystemExit(2)


def parse_mesh(text: str) -> dict[str, int]:
    """``"data=4,model=2"`` -> ``{"data": 4, "model": 2}``."""
    axes: dict[str, int] = {}
    for part in text.split(","):
        name, _, size = part.partition("=")
        if not name or not size.lstrip("-").isdigit():
            raise argparse.ArgumentTypeError(
                f"--mesh {text!r}: write axis=size pairs separated by commas, e.g. data=4,model=2"
            )
        if int(size) < 1:
            raise argparse.ArgumentTypeError(f"--mesh {text!r}: axis {name!r} needs a size >= 1")
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


def cpu_devices(count: int) -> None:
    """Simulates ``count`` CPU devices, before JAX starts its backend (CPU only)."""
    import jax

    # If JAX already started in this process, it keeps the devices it has.
    with contextlib.suppress(RuntimeError):
        jax.config.update("jax_num_cpu_devices", count)


def sharding_from_flags(mesh: dict[str, int], spec: tuple[Any, ...]) -> Any:
    """The ``NamedSharding`` that ``--mesh`` and ``--spec`` describe, on CPU devices
    (after ``check_layout``, which ends the command on a spec that does not fit)."""
    from jax.sharding import NamedSharding, PartitionSpec

    import meshfeed

    cpu_devices(math.prod(mesh.values()))
    return NamedSharding(meshfeed.make_mesh(**mesh), PartitionSpec(*spec))  # type: ignore[arg-type]


def plan_data(args: argparse.Namespace, sharding: Any) -> Any:
    """``meshfeed plan --data``: the plan of a loader over the dataset, and with
    ``--processes``, what that many hosts ask of its store."""
    import meshfeed

    options = {"endpoint_url": args.endpoint_url} if args.endpoint_url else None
    order = {"shuffle_block": args.shuffle_block, "shuffle_window": args.shuffle_window}
    try:
        return meshfeed.inspect.plan(
            sharding,
            data=args.data,
            processes=args.processes,
            global_batch_size=args.batch,
            storage_options=options,
            store_rps=args.store_rps,
            loader_options=order,
        )
    except (OSError, ValueError) as error:
        fail(str(error).splitlines()[0])


def check_layout(
    mesh: dict[str, int], spec: tuple[Any, ...], shape: tuple[int, ...] | None, processes: Any
) -> None:
    """Ends the command with one line if ``shape`` or ``processes`` do not fit the mesh."""
    used = [a for e in spec if e for a in ((e,) if isinstance(e, str) else e)]
    if set(used) - set(mesh):
        fail(f"--spec names {sorted(set(used) - set(mesh))}, not axes of --mesh {mesh}.")
    twice = sorted({a for a in used if used.count(a) > 1})
    if twice:
        fail(f"--spec uses mesh axis {twice[0]!r} on two dimensions; each axis splits one.")
    devices = math.prod(mesh.values())
    if processes is not None and (processes < 1 or devices % processes):
        fail(f"--processes {processes} must divide the {devices} devices of --mesh evenly.")
    if shape is None:
        return
    if len(spec) > len(shape):
        fail(
            f"--spec has {len(spec)} entries but --shape {list(shape)} has {len(shape)} dimensions."
        )
    for dim, (entry, size) in enumerate(zip(spec, shape, strict=False)):
        axes = () if entry is None else (entry,) if isinstance(entry, str) else entry
        parts = math.prod(mesh[a] for a in axes)
        if size % parts:
            fail(
                f"dimension {dim} of --shape is {size}, which does not split into {parts} "
                f"equal blocks over {'+'.join(axes)}; pass a multiple of {parts}."
            )
