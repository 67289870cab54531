"""Checkpoints: the train state and the loader's position, saved as a run goes on.

A checkpoint holds two items: ``state`` (any pytree of ``jax.Array``, saved and
restored by every process together, each writing its own shards) and ``loader``
(``Loader.state()``: steps consumed plus the fingerprint of what the order depends on).
Restoring takes a *target* state -- built on the mesh the job runs on now, e.g. by
``TrainState.create`` -- whose shardings say where each array goes, so a checkpoint
from 2 processes restores onto 1 or 4: each array's new shards are read, and the
loader's state, which does not depend on the topology, continues the same global
batches. A loader built over other data, another seed or another batch size refuses
the state, naming the field.

Where they go: a local folder (on a file system every process shares) or ``gs://`` is
an Orbax ``CheckpointManager``; ``s3://`` is ``_s3_checkpoints`` (Orbax cannot write
S3). Either way a save is asynchronous: it returns once the arrays are copied off the
devices -- so the next steps may donate them -- and writes in the background while
training goes on; the next save, a restore and ``close`` wait for it, and a step is
whole only once its commit is written (a save cut short is never read).
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Mapping
from typing import Any

import jax

from meshfeed.cluster._initialize import ensure_watched
from meshfeed.cluster._preemption import Preemption, preemption
from meshfeed.cluster._watch import activity
from meshfeed.feed._loader import Loader
from meshfeed.train._s3_checkpoints import S3Checkpoints

SCHEMES = ("gs", "s3")
"""The URL schemes checkpoints go to, besides local folders."""


def _ocp() -> Any:
    try:
        import orbax.checkpoint as ocp
    except ImportError:
        raise ImportError(
            "checkpoints need Orbax: pip install 'meshfeed[checkpoint]'"
            " (from a clone: pip install -e '.[checkpoint]')."
        ) from None
    return ocp


def where(directory: str | os.PathLike[str]) -> str:
    """``directory`` as checkpoints name it: a URL as given, a local path made absolute;
    an unknown scheme is refused."""
    path = os.fspath(directory)
    if "://" not in path:
        return os.path.abspath(path)
    scheme = path.split("://", 1)[0]
    if scheme not in SCHEMES:
        raise ValueError(
            f"checkpoint directory {path!r}: {scheme}:// is not a place checkpoints go; pass "
            "a local folder (shared by every process), gs://BUCKET/PATH or s3://BUCKET/PATH."
        )
    if scheme == "gs" and importlib.util.find_spec("gcsfs") is None:
        raise ImportError(  # Orbax's paths reach gs:// through it
            "checkpoints on gs:// need gcsfs, through which Orbax writes their metadata: "
            "pip install gcsfs."
        )
    return path.rstrip("/")


class Checkpoints:
    """The checkpoints under one directory: a local folder, ``gs://`` or ``s3://``.

    Args:
      directory: where checkpoints live, one subfolder per step; the same path on every
        process (a local folder must be on a file system they all share).
      max_to_keep: the newest checkpoints kept; older ones are deleted.
      storage_options: for ``s3://``, the store's endpoint (``endpoint_url``, as the
        data's URLs take it) and region (``client_kwargs={"region_name": ...}``);
        credentials come from the environment (``AWS_ACCESS_KEY_ID``, ...).
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        max_to_keep: int = 3,
        storage_options: Mapping[str, Any] | None = None,
    ) -> None:
        if isinstance(max_to_keep, bool) or not isinstance(max_to_keep, int) or max_to_keep < 1:
            raise ValueError(f"max_to_keep={max_to_keep!r} must be an int >= 1.")
        self.directory = where(directory)
        self._s3: S3Checkpoints | None = None
        self._manager: Any = None
        if self.directory.startswith("s3://"):
            self._s3 = S3Checkpoints(
                self.directory, max_to_keep=max_to_keep, storage_options=storage_options
            )
            return
        ocp = _ocp()
        self._manager = ocp.CheckpointManager(
            self.directory,
            options=ocp.CheckpointManagerOptions(max_to_keep=max_to_keep, create=True),
        )

    def latest_step(self) -> int | None:
        """The newest step saved, or ``None``."""
        if self._s3 is not None:
            return self._s3.latest_step()
        return self._manager.latest_step()

    def save(self, step: int, state: Any, loader: Loader | None = None) -> None:
        """Starts saving ``state`` (and ``loader``'s position) as ``step``; every process
        calls it. It returns once the arrays are off the devices (see the module
        docstring); ``wait`` or ``close`` for the save to be whole."""
        with activity(f"saving checkpoint {step} under {self.directory}"):
            if self._s3 is not None:
                self._s3.save(step, state, None if loader is None else loader.state())
                return
            ocp = _ocp()
            items = {"state": ocp.args.StandardSave(state)}
            if loader is not None:
                items["loader"] = ocp.args.JsonSave(loader.state())
            self._manager.save(step, args=ocp.args.Composite(**items))

    def wait(self) -> None:
        """Returns once the last save is whole on the store."""
        with activity(f"finishing a checkpoint under {self.directory}"):
            if self._s3 is not None:
                self._s3.wait()
            else:
                self._manager.wait_until_finished()

    def restore(self, target: Any, loader: Loader | None = None, *, step: int | None = None) -> Any:
        """The state saved at ``step`` (default: the newest), laid out like ``target``.

        ``loader``, when given, continues where the saved one was. Raises
        ``FileNotFoundError`` when there is no checkpoint.
        """
        self.wait()
        step = self.latest_step() if step is None else step
        if step is None:
            raise FileNotFoundError(f"no checkpoint under {self.directory}.")
        with activity(f"restoring checkpoint {step} from {self.directory}"):
            if self._s3 is not None:
                state, saved = self._s3.restore(target, step)
            else:
                ocp = _ocp()
                abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, target)
                items = {"state": ocp.args.StandardRestore(abstract)}
                if loader is not None:
                    items["loader"] = ocp.args.JsonRestore()
                restored = self._manager.restore(step, args=ocp.args.Composite(**items))
                state, saved = restored["state"], restored.get("loader")
        if loader is not None:
            if saved is None:
                raise ValueError(
                    f"the checkpoint at step {step} under {self.directory} holds no loader "
                    "state; restore it without a loader."
                )
            loader.restore(saved)
        return state

    def close(self) -> None:
        """Waits for the last save, then lets go of the directory."""
        if self._s3 is not None:
            self._s3.close()
        else:
            self._manager.close()


def save_checkpoint(
    directory: str | os.PathLike[str],
    step: int,
    state: Any,
    loader: Loader | None = None,
    *,
    max_to_keep: int = 3,
    storage_options: Mapping[str, Any] | None = None,
) -> None:
    """Saves ``state`` and ``loader``'s position under ``directory`` as ``step``.

    Every process calls it with the same arguments (each writes its own shards); it
    returns once the checkpoint is whole. ``directory``: a local folder every process
    shares, ``gs://BUCKET/PATH`` or ``s3://BUCKET/PATH`` (``storage_options``: the
    store's ``endpoint_url``, as for data URLs). For saves that run on while training
    goes on, keep a ``Checkpoints`` or let ``fit(checkpoint_dir=)`` save.
    """
    checkpoints = Checkpoints(directory, max_to_keep=max_to_keep, storage_options=storage_options)
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
    storage_options: Mapping[str, Any] | None = None,
) -> Any:
    """The state saved under ``directory`` (newest, or ``step``), laid out like ``target``.

    ``target`` is a state of the same structure built on the current mesh (e.g. a fresh
    ``TrainState.create``); ``loader``, when given, continues where the saved one was.
    ``directory`` and ``storage_options`` as for ``save_checkpoint``.
    """
    checkpoints = Checkpoints(directory, storage_options=storage_options)
    try:
        return checkpoints.restore(target, loader, step=step)
    finally:
        checkpoints.close()


def on_preemption() -> Preemption:
    """Catches a preemption notice (SIGTERM) for a loop of your own; ``fit`` does this.

    Call it on every process before the loop (on the main thread), then
    ``preemption.reached(step)`` after each step: it is ``True`` at one step, the same
    on every process, once any process got SIGTERM -- save that step there on every
    process, and stop with ``preemption.stop()``::

        preemption = meshfeed.train.on_preemption()
        for step in range(start + 1, num_steps + 1):
            state, metrics = train_step(state, next(batches))
            if preemption.reached(step):
                meshfeed.save_checkpoint(directory, step, state, loader)
                preemption.stop()  # says who was told and where; exits with code 0

    Relaunched, the run restores that step and goes on with the batches an unbroken
    run would have had. With several processes the agreement travels on the watch
    (``meshfeed.initialize``), which this starts if nothing watches the job yet.
    """
    ensure_watched()
    notice = preemption()
    if not notice.install():
        raise RuntimeError(
            "on_preemption() catches SIGTERM, which Python lets only the main thread do; "
            "call it from the main thread."
        )
    return notice
