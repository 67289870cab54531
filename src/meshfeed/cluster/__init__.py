"""Processes: connecting them, starting them on one machine, and watching them.

``initialize`` connects the processes of a job (launched by ``meshfeed launch``,
detected on a cluster, given explicit arguments, or alone) and starts the watch, which
ends the whole job within a second, with one line, when a process is lost; ``watch``
(which the loader calls) starts it for a job that called ``jax.distributed.initialize``
itself; ``shutdown`` lets a process leave with ``os._exit`` without being reported
lost. The watch's connections also carry a preemption's agreement (``_preemption``: a
SIGTERM on any process becomes one step at which every process saves and stops).
``launch`` starts and supervises several processes on this machine; ``_ray_connect``
reaches a Ray cluster for the layers above that spread work over one (record workers,
index and packing-plan builds). The layer sits just above the floor, below the data and
the loader, because the layers above tell the watch what their process is doing (the
loader its step, ``fit`` its step, checkpoints their save), so that the line a survivor
prints can say where the job was.

Modules, lowest first (each imports only modules listed before it)::

    _env           the environment meshfeed launch sets; require_initialized
    _stall         Stalls: each process's progress, a stuck one named (stall_s, on_stall)
    _preemption    Preemption: a SIGTERM on any process made one step every process stops at
    _watch         the watch on the other processes: a lost one ends the job, named; doing
    _initialize    initialize: connect the processes (launched, cluster, explicit, alone);
                   watch: start the watch (ensure_watched: what the loader checks);
                   shutdown: JAX's shutdown barrier, then the goodbye (os._exit may follow)
    _launch        launch: local processes, started and supervised
    _ray_connect   reaching a Ray cluster (this one's, RAY_ADDRESS's, or a local one);
                   RayOptions: what a Ray worker reserves

Users import these names from ``meshfeed``; this package exports nothing of its own.
"""

__all__: list[str] = []
