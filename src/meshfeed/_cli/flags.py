"""Flags of the ``meshfeed`` command: meshes, specs and shapes written as text."""

from __future__ import annotations

import argparse
import contextlib
import math
from typing import Any

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


def cpu_devices(count: int) -> None:
    """Simulates ``count`` CPU devices, before JAX starts its backend (CPU only)."""
    import jax

    # If JAX already started in this process, it keeps the devices it has.
    with contextlib.suppress(RuntimeError):
        jax.config.update("jax_num_cpu_devices", count)


def sharding_from_flags(mesh: dict[str, int], spec: tuple[Any, ...]) -> Any:
    """The ``NamedSharding`` that ``--mesh`` and ``--spec`` describe, on CPU devices."""
    from jax.sharding import NamedSharding, PartitionSpec

    import meshfeed

    named = {a for e in spec if e for a in ((e,) if isinstance(e, str) else e)}
    if named - set(mesh):
        raise SystemExit(f"meshfeed: --spec names {sorted(named - set(mesh))}, not axes of --mesh.")
    cpu_devices(math.prod(mesh.values()))
    return NamedSharding(meshfeed.make_mesh(**mesh), PartitionSpec(*spec))  # type: ignore[arg-type]


def plan_data(args: argparse.Namespace, sharding: Any) -> Any:
    """``meshfeed plan --data``: the plan of a loader over the dataset, on this process."""
    import meshfeed

    options = {"endpoint_url": args.endpoint_url} if args.endpoint_url else None
    try:
        source = meshfeed.open_source(args.data, storage_options=options)
    except (OSError, ValueError) as error:
        raise SystemExit(f"meshfeed plan: {error}") from None
    loader = meshfeed.Loader(
        source,
        global_batch_size=args.batch,
        sharding=sharding,
        shuffle_block=args.shuffle_block,
        shuffle_window=args.shuffle_window,
    )
    return loader.plan
