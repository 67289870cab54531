"""Keras 3 models (JAX backend) in meshfeed's training: a ``TrainState``, a step, back.

A Keras model keeps its values in variables; meshfeed's steps are pure functions of a
``TrainState``. The functions here go between the two the way the Keras multi-device
guide does (``model.stateless_call``, ``optimizer.stateless_apply``) and leave the
placing, the step and the loop to meshfeed's ``TrainState``, ``make_train_step`` and
``fit``, so a Keras model trains in every mode, and checkpoints and resumes, like any
other:

- ``create_state(model, optimizer, mesh=..., layout_map=None, seed=0)``: the values of
  the trainable variables become ``state.params``, those of the others (batch-norm
  statistics, the seed generators' state) ``state.model_state``, both lists in the
  model's order (``model.trainable_variables``, ``model.non_trainable_variables``). Each
  is placed by the layout a ``keras.distribution.LayoutMap`` (or a set ``ModelParallel``
  distribution) gives it, replicated otherwise; the optimizer's moments follow their
  variable. With several processes every replica starts from process 0's values.
- ``make_train_step(model, loss, optimizer, mesh=..., mode=..., x=..., y=...)``, in
  the three modes of ``meshfeed.make_train_step``. The loss is the mean over the valid
  rows (padded rows do not count) plus the model's own losses (regularizers). Dropout
  draws from ``state.rng`` (one seed per seed generator, per step, and per device in the
  manual modes), so a run is reproducible and resumes exactly; the model's own seeds do
  not matter. Keras' ``BatchNormalization`` has no cross-device statistics on JAX, so
  under ``"shard_map"`` and ``"pmap"`` it normalises each device's rows with their own
  statistics and its moving statistics are the devices' average; ``"jit"`` normalises
  with the global batch's.
- ``make_eval_fn(model, loss, ...)``: for ``meshfeed.fit``'s evaluation.
- ``update_model(model, state)``: writes the trained values back, so ``model.predict``,
  ``evaluate`` and ``save`` work as usual.
- ``fit(model, loader, ...)``: the four in one call that returns a Keras ``History``.

The optimizer is a ``keras.optimizers.Optimizer`` or an optax ``GradientTransformation``.
``TrainState`` runs optax's interface, so a Keras optimizer is run through it: the state
holds its variables' values (``state.opt_state``, in ``optimizer.variables`` order) and
each step calls its ``stateless_apply``, whose new values become the update (new - old:
a parameter equals what Keras computes to float rounding). Learning-rate schedules,
clipping and weight decay work as in ``model.fit``. ``KerasTrainer``, the class of
earlier releases, is a deprecated wrapper over ``fit``.

An optional extra (``pip install 'meshfeed[keras]'``), on the JAX backend only: set
``KERAS_BACKEND=jax`` before Keras is first imported.
"""

try:
    import keras
except ImportError as error:
    raise ImportError(
        "meshfeed.keras needs Keras 3 on the JAX backend, and importing keras failed "
        f"({error}). Install it with pip install 'meshfeed[keras]'"
        " (from a clone: pip install -e '.[keras]') and set "
        "KERAS_BACKEND=jax before keras is first imported (os.environ['KERAS_BACKEND'] "
        "= 'jax' at the top of your script)."
    ) from error

if keras.backend.backend() != "jax":
    raise ImportError(
        f"meshfeed.keras needs Keras on the JAX backend, but Keras runs on "
        f"{keras.backend.backend()!r}; set KERAS_BACKEND=jax before keras is first imported "
        "(os.environ['KERAS_BACKEND'] = 'jax' at the top of your script)."
    )

from meshfeed.keras._fit import KerasTrainer as KerasTrainer
from meshfeed.keras._fit import fit as fit
from meshfeed.keras._state import create_state as create_state
from meshfeed.keras._state import update_model as update_model
from meshfeed.keras._steps import make_eval_fn as make_eval_fn
from meshfeed.keras._steps import make_train_step as make_train_step

__all__ = ["KerasTrainer", "create_state", "fit", "make_eval_fn", "make_train_step", "update_model"]
