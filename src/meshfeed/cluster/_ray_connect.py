"""Reaching a Ray cluster for record workers, and what the workers ask of it.

``RayOptions`` says what each record worker (a Ray actor) reserves: CPUs, and custom
resources that pin the workers to the nodes started with them (``ray start
--resources='{"decode": 8}'`` on the CPU-only nodes, ``RayOptions(resources={"decode":
1})``). ``connect`` joins the cluster this process is already connected to, or the one
``RAY_ADDRESS`` names, or starts a local one of its own (never one that another
program on this machine registered); an address that takes no connection is an
error naming it within ``connect_s`` seconds, never a hang, and a missing Ray names the
extra to install. It must run on the thread that uses Ray first (the loader's, when it
is built): a process that started Ray from another thread ends on its first use.
"""

from __future__ import annotations

import dataclasses
import os
import socket
import time
import warnings
from collections.abc import Mapping
from types import ModuleType

_PORT = 6379  # Ray's default GCS port, for an address given without one
INLINE_BYTES = 8 << 20
"""Replies up to this size come back in the call's own message, not through Ray's
object store: its bookkeeping cost 2.65 ms of CPU a batch of 256 decoded images on the
benchmarks' machine, the inline copy 0.25 (records/s 0.69x worker processes' against
0.83x). A cluster gets it with ``ray start --head --system-config=
'{"max_direct_call_object_size": 8388608}'``; a local Ray the loader starts has it."""
LOCAL_RAY = {
    "address": "local",
    "include_dashboard": False,
    "_system_config": {"max_direct_call_object_size": INLINE_BYTES},
}


@dataclasses.dataclass(frozen=True)
class RayOptions:
    """Where ``worker_type="ray"`` runs its record workers, and what each reserves.

    Pass ``worker_type=meshfeed.types.RayOptions(...)`` instead of ``"ray"`` to set them.

    Args:
      cpus: CPUs each worker reserves (default 1). A record transform that runs its own
        threads (a video decoder, say) may ask for more.
      resources: custom resources each worker reserves, e.g. ``{"decode": 1}`` for
        nodes started with ``ray start --resources='{"decode": 8}'``: the workers then
        run only there, and never on the training hosts.
      connect_s: how long reaching the cluster may take before it is an error naming
        the address (default 30 s).
      replace_s: how long the loader waits for a new worker when none is left (all lost
        with their nodes, say) before it raises (default 60 s).
    """

    cpus: float = 1.0
    resources: Mapping[str, float] = dataclasses.field(default_factory=dict)
    connect_s: float = 30.0
    replace_s: float = 60.0

    def __post_init__(self) -> None:
        if isinstance(self.cpus, bool) or not isinstance(self.cpus, int | float):
            raise TypeError(f"RayOptions(cpus={self.cpus!r}) must be a number of CPUs.")
        if self.cpus < 0:
            raise ValueError(f"RayOptions(cpus={self.cpus}) must be >= 0.")
        if not isinstance(self.resources, Mapping) or not all(
            isinstance(k, str) and isinstance(v, int | float) and v > 0
            for k, v in self.resources.items()
        ):
            raise TypeError(
                f"RayOptions(resources={self.resources!r}) must map resource names to "
                'amounts > 0, e.g. {"decode": 1}.'
            )
        for name in ("connect_s", "replace_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
                raise ValueError(f"RayOptions({name}={value!r}) must be a number of seconds > 0.")
        object.__setattr__(self, "resources", dict(self.resources))


def import_ray(what: str = "worker_type='ray'") -> ModuleType:
    """The ``ray`` module, or an error naming the extra that installs it (``what``: the
    option that asked for Ray)."""
    try:
        import ray
    except ImportError:
        raise ImportError(
            f"{what} needs Ray: pip install 'meshfeed[ray]' (from a clone: pip install -e "
            "'.[ray]')."
        ) from None
    return ray


def _host_port(address: str) -> tuple[str, int] | None:
    """The GCS host and port of a ``RAY_ADDRESS``, or ``None`` for one that names no
    socket to try (``auto``, ``local``, a ``ray://`` client address is tried too)."""
    rest = address.split("://", 1)[1] if "://" in address else address
    if rest in ("auto", "local", ""):
        return None
    host, _, port = rest.rpartition(":") if ":" in rest else (rest, "", "")
    if not port.isdigit():
        return rest, _PORT
    return host.strip("[]"), int(port)


def _reachable(address: str, deadline: float) -> None:
    """Returns once ``address`` takes a TCP connection; raises past ``deadline``."""
    target = _host_port(address)
    if target is None:
        return
    error: OSError | None = None
    while True:
        try:
            wait = min(5.0, max(0.1, deadline - time.monotonic()))
            with socket.create_connection(target, timeout=wait):
                return
        except OSError as failed:
            error = failed
        if time.monotonic() >= deadline:
            break
        time.sleep(min(1.0, max(0.0, deadline - time.monotonic())))
    raise ConnectionError(
        f"the Ray cluster at RAY_ADDRESS={address!r} cannot be reached ({error}); start it "
        "there (ray start --head --port=6379), fix RAY_ADDRESS, or unset it to start a "
        "local Ray for this process."
    )


def connect(options: RayOptions) -> ModuleType:
    """``ray``, connected: to the cluster this process is on already, to ``RAY_ADDRESS``,
    or to a local one it starts; an error naming the address within
    ``options.connect_s`` seconds if it cannot be reached."""
    ray = import_ray()
    if ray.is_initialized():
        return ray
    address = os.environ.get("RAY_ADDRESS", "")
    deadline = time.monotonic() + options.connect_s
    if address:
        _reachable(address, deadline)
    try:  # in this thread: a Ray started from another thread ends the process on use
        with warnings.catch_warnings():  # its processes exec at once: JAX's fork warning
            warnings.filterwarnings("ignore", "os.fork", RuntimeWarning)  # does not apply
            ray.init(**({} if address else LOCAL_RAY))
    except Exception as error:
        where = f"RAY_ADDRESS={address!r}" if address else "a local Ray"
        raise ConnectionError(f"connecting to {where} failed: {error}") from error
    return ray
