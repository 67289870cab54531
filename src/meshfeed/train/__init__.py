"""Training on the loader's batches: state, steps, the loop, checkpoints.

``TrainState`` holds parameters, optimizer state, model state and a key, placed on a
mesh. ``make_train_step`` builds one step three ways -- ``jit`` (automatic SPMD),
``shard_map`` and ``pmap`` -- that give the same parameters. ``fit`` runs steps fed by
a loader with progress, metrics, evaluation and checkpoints; checkpoints keep the
loader's position beside the state, so a relaunch resumes the exact stream. The
attention mask for packed rows lives here, with the models that use it. The Keras and
Flax NNX trainers (``meshfeed.keras``, ``meshfeed.flax``) sit on top of this layer.

Modules, lowest first (each imports only modules listed before it)::

    _train_state   TrainState: parameters, optimizer state, model state, a key; placed on a mesh
    _steps         make_train_step (jit, shard_map, pmap), masked_mean, collective_axes
    _attention     segment_mask: attention inside each document of a packed row
    _checkpoint    Orbax checkpoints with the loader's state beside them
    _writers       fit's figures to CLU, tensorboardX or W&B writers; every process's wait
    _fit           fit and History

The names most users need are at the top level (``meshfeed.fit``, ``meshfeed.TrainState``,
``meshfeed.make_train_step``, ...); this package exports the rest: the types of a step and
its batch, the modes, ``collective_axes`` and ``History``.
"""

from meshfeed.train._fit import EvalFn as EvalFn
from meshfeed.train._fit import History as History
from meshfeed.train._fit import StepFn as StepFn
from meshfeed.train._steps import MODES as MODES
from meshfeed.train._steps import Batch as Batch
from meshfeed.train._steps import LossFn as LossFn
from meshfeed.train._steps import Mode as Mode
from meshfeed.train._steps import collective_axes as collective_axes

__all__ = ["MODES", "Batch", "EvalFn", "History", "LossFn", "Mode", "StepFn", "collective_axes"]
