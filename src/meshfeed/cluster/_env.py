"""The environment ``meshfeed launch`` gives each process it starts, in one place.

The launcher (and ``meshfeed.testing.run_in_processes``, which runs on it) sets these
variables; ``meshfeed.initialize()`` reads them to connect the processes, and the
loader reads the process count to catch a script that forgot to call it. Nothing else
in meshfeed reads the environment.
"""

from __future__ import annotations

import os

import jax

ENV_COORDINATOR = "MESHFEED_COORDINATOR"
ENV_NUM_PROCESSES = "MESHFEED_NUM_PROCESSES"
ENV_PROCESS_ID = "MESHFEED_PROCESS_ID"


def require_initialized() -> None:
    """Raises if this process was started as one of several but never connected to them."""
    expected = int(os.environ.get(ENV_NUM_PROCESSES, "1") or 1)
    if expected > 1 and jax.process_count() == 1:
        raise RuntimeError(
            f"this process was started as one of {expected} (by meshfeed launch or "
            "run_in_processes) but jax.distributed is not initialised, so it sees only its "
            "own devices; call meshfeed.initialize() before building meshes or loaders."
        )
