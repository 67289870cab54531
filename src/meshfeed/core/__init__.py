"""The floor: the pieces several layers above stand on.

A mesh and its axes are what every layer talks about: the data layer's cost model, the
strategies, the train steps and the pictures all ask which batch rows a device or a
process holds, so those helpers live here once. The keyed permutation is another
shared piece: the loader's schedule orders each epoch with it, the packing plan orders
documents with it, a mixture each pass over a source. Stages are the third: a batch size
that ramps and mixture weights that change are both a value by step, compared the same
way on restore. The context layout is another: the data layer lays rows out with it and
the training layer restores outputs with it. Host memory lent to arrays is the last: the
record workers' slots and the record stage's buffers both reach the devices without a
copy and come back only when no array points at them. Nothing here reads data, starts a
thread or touches a device at import.

Modules, lowest first (each imports only modules listed before it)::

    _mesh          make_mesh, batch_sharding; which batch rows each device and process holds
    _permutation   Permutation: a keyed bijection on [0, n), evaluated position by position; hash64
    _context_layout  the context layouts: a row's tokens permuted to balance causal attention
    _stages        Stages: a setting that changes at given steps; BatchSizes: steps <-> positions
    _tally         Tally: counts and seconds that several threads add to
    _held          host memory lent to arrays, given back when no array points at it; HostBuffers
    _waits         WAITS: what this process waits on now, and its last step (stall reports)
    _npy           load_npy, load_npz, NPY_HEADERS: numpy headers parsed one thread at a time
    _lru           SizedLRU: values by key within a byte budget, least recently used dropped first

Users import these names from ``meshfeed``; this package exports nothing of its own.
"""

__all__: list[str] = []
