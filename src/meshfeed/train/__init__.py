"""Training on the loader's batches: state, steps, the loop, checkpoints.

``TrainState`` holds parameters, optimizer state, model state and a key, placed on a
mesh. ``make_train_step`` builds one step three ways -- ``jit`` (automatic SPMD),
``shard_map`` and ``pmap`` -- that give the same parameters. ``fit`` runs steps fed by
a loader with progress, metrics, evaluation and checkpoints; checkpoints keep the
loader's position beside the state, so a relaunch resumes the exact stream. The
attention mask for packed rows lives here, with the models that use it. The Keras and
Flax NNX trainers (``meshfeed.keras``, ``meshfeed.flax``) sit on top of this layer.

Modules, lowest first (each imports only modules listed before it)::

    _param_sharding  parameters and optimizer state laid out: as placed, FSDP, or a rule
    _train_state   TrainState: parameters, optimizer state, model state, a key; placed on a mesh
    _step_parts    what every mode computes: gradient, valid rows, keys; masked_mean
    _microbatches  a step's parts (devices, microbatches) weighted by what the loss counts
    _pmap_step     mode="pmap": the batch reshaped per device, the state gathered and rewrapped
    _steps         make_train_step (jit, shard_map, pmap), with donation
    _attention     segment_mask: attention inside each document of a packed row
    _packed_attention_kernel  the blockwise kernel: online softmax, FlashAttention-2 gradient
    _packed_attention  packed_attention: attention inside documents without a dense mask
    _context       restore_order: a context layout undone on the devices
    _s3_checkpoints  checkpoints on S3: JAX's array serialization to TensorStore's S3 store
    _checkpoint    checkpoints (Orbax, or S3) with the loader's state beside them; async
    _writers       fit's figures to CLU, tensorboardX or W&B writers; every process's wait
    _input_clock   a loop's input wait timed against its steps; at most two steps ahead
    _fit_checkpoints  a loop's saves: resume, save when due, stop at a preemption's step
    _evaluate      evaluator: a metric's mean over every valid row; when a loop evaluates
    _fit_log       a log step's figures (the step, its input, the loader), to the writer
    _fit_progress  the bar and the lines process 0 shows
    _fit           fit and History: the step loop, calling those parts in turn

The names most users need are at the top level (``meshfeed.fit``, ``meshfeed.TrainState``,
``meshfeed.make_train_step``, ...); this package exports the rest: the types of a step and
its batch, the modes, ``collective_axes``, ``History``, ``Checkpoints`` (saves that run on
while training goes on) and ``on_preemption`` (a SIGTERM made one saved step, for a loop
of your own).
"""

from meshfeed.cluster._preemption import Preemption as Preemption
from meshfeed.train._checkpoint import Checkpoints as Checkpoints
from meshfeed.train._checkpoint import on_preemption as on_preemption
from meshfeed.train._context import restore_order as restore_order
from meshfeed.train._evaluate import EvalFn as EvalFn
from meshfeed.train._fit import History as History
from meshfeed.train._fit import StepFn as StepFn
from meshfeed.train._packed_attention import packed_attention as packed_attention
from meshfeed.train._step_parts import MODES as MODES
from meshfeed.train._step_parts import Batch as Batch
from meshfeed.train._step_parts import LossFn as LossFn
from meshfeed.train._step_parts import Mode as Mode
from meshfeed.train._step_parts import collective_axes as collective_axes
from meshfeed.train._steps import TrainStep as TrainStep

__all__ = [
    "MODES",
    "Batch",
    "Checkpoints",
    "EvalFn",
    "History",
    "LossFn",
    "Mode",
    "Preemption",
    "StepFn",
    "TrainStep",
    "collective_axes",
    "on_preemption",
    "packed_attention",
    "restore_order",
]
