"""Checkpoints: the train state with Orbax, the loader's position as JSON beside it.

A checkpoint is one Orbax ``CheckpointManager`` step holding two items: ``state`` (any
pytree of ``jax.Array``, saved and restored by every process together, each writing its
own shards) and ``loader`` (``Loader.state()``: steps consumed plus the fingerprint of
what the order depends on). Restoring takes a *target* state -- built on the mesh the
job runs on now, e.g. by ``TrainState.create`` -- whose shardings say where each array
goes, so a checkpoint from 2 processes restores onto 1 or 4: Orbax reads each array's
new shards, and the loader's state, which does not depend on the topology, continues
the same global batches. A loader built over other data, another seed or another batch
size refuses the state, naming the field.
"""

from __future__ import annotations

import os
from typing import Any

import jax

from meshfeed.cluster._watch import activity
from meshfeed.feed._loader import Loader


def _ocp() -> Any:
    try:
        import orbax.checkpoint as ocp
    except ImportError:
        raise ImportError(
            "checkpoints need Orbax: pip install 'meshfeed[checkpoint]'"
            " (from a clone: pip install -e '.[checkpoint]')."
        ) from None
    return ocp


class Checkpoints:
    """The checkpoints under one directory (an Orbax ``CheckpointManager``).

    Args:
      directory: where checkpoints live, one subfolder per step; the same path on every
        process.
      max_to_keep: the newest checkpoints kept; older ones are deleted.
    """

    def __init__(self, directory: str | os.PathLike[str], *, max_to_keep: int = 3) -> None:
        ocp = _ocp()
        self.directory = os.path.abspath(os.fspath(directory))
        self._manager = ocp.CheckpointManager(
            self.directory,
            options=ocp.CheckpointManagerOptions(max_to_keep=max_to_keep, create=True),
        )

    def latest_step(self) -> int | None:
        """The newest step saved, or ``None``."""
        return self._manager.latest_step()

    def save(self, step: int, state: Any, loader: Loader | None = None) -> None:
        """Saves ``state`` (and ``loader``'s position) as ``step``; every process calls it."""
        ocp = _ocp()
        items = {"state": ocp.args.StandardSave(state)}
        if loader is not None:
            items["loader"] = ocp.args.JsonSave(loader.state())
        with activity(f"saving checkpoint {step} under {self.directory}"):
            self._manager.save(step, args=ocp.args.Composite(**items))
            self._manager.wait_until_finished()

    def restore(self, target: Any, loader: Loader | None = None, *, step: int | None = None) -> Any:
        """The state saved at ``step`` (default: the newest), laid out like ``target``.

        ``loader``, when given, continues where the saved one was. Raises
        ``FileNotFoundError`` when there is no checkpoint.
        """
        ocp = _ocp()
        step = self.latest_step() if step is None else step
        if step is None:
            raise FileNotFoundError(f"no checkpoint under {self.directory}.")
        abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, target)
        items = {"state": ocp.args.StandardRestore(abstract)}
        if loader is not None:
            items["loader"] = ocp.args.JsonRestore()
        with activity(f"restoring checkpoint {step} from {self.directory}"):
            restored = self._manager.restore(step, args=ocp.args.Composite(**items))
        if loader is not None:
            if restored.get("loader") is None:
                raise ValueError(
                    f"the checkpoint at step {step} under {self.directory} holds no loader "
                    "state; restore it without a loader."
                )
            loader.restore(restored["loader"])
        return restored["state"]

    def close(self) -> None:
        self._manager.close()


def save_checkpoint(
    directory: str | os.PathLike[str],
    step: int,
    state: Any,
    loader: Loader | None = None,
    *,
    max_to_keep: int = 3,
) -> None:
    """Saves ``state`` and ``loader``'s position under ``directory`` as ``step``.

    Every process calls it with the same arguments (each writes its own shards).
    """
    checkpoints = Checkpoints(directory, max_to_keep=max_to_keep)
    try:
        checkpoints.save(step, state, loader)
    finally:
        checkpoints.close()


def restore_checkpoint(
    directory: str | os.PathLike[str],
    target: Any,
    loader: Loader | None = None,
    *,
    step: int | None = None,
) -> Any:
    """The state saved under ``directory`` (newest, or ``step``), laid out like ``target``.

    ``target`` is a state of the same structure built on the current mesh (e.g. a fresh
    ``TrainState.create``); ``loader``, when given, continues where the saved one was.
    """
    checkpoints = Checkpoints(directory)
    try:
        return checkpoints.restore(target, loader, step=step)
    finally:
        checkpoints.close()
