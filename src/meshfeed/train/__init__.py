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

Users import these names from ``meshfeed``; this package exports nothing of its own.
"""

__all__: list[str] = []
