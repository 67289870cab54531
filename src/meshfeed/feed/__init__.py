"""Feeding the mesh: a source and a schedule in, global ``jax.Array`` batches out.

The schedule maps each step to example ids from the seed, the epoch and the batch size
alone, so every process computes it on its own. The planner says what each strategy
costs and which one ``"auto"`` picks; the shardings say which rows go to which device;
a strategy reads this process's rows and places them; the read-ahead runs steps on
background threads; the state is the steps consumed and a fingerprint. ``Loader`` is
the façade over all of it. The planner sits here rather than with the pictures in
``inspect`` because ``"auto"`` is a strategy that needs it; ``check_replicas`` sits here
because the loader runs it. Nothing here renders.

Modules, lowest first (each imports only modules listed before it)::

    _schedule      step -> example ids: shuffled or block-shuffled epochs, padding, ramps
    _timeline      what holds at each step: the batch size and a mixture's weights, by stage
    _plan          the strategies' names, their costs, and what "auto" picks
    _shardings     the sharding of each field, the rows it puts where; place_host
    _strategies    per strategy, the rows a process reads and how they are placed; reshard
    _skips         the examples on_error="skip" skipped, and the budget max_skipped sets
    _option        one Loader option defined once: a field with its group, text and check
    _options       LoaderOptions: each option defined once, checked alone and by group
    _balanced      a balanced source's steps of even cost, dealt to the devices by cost
    _source_check  the source checked against the options: its kind, length and fields
    _source_rows   the source's values of a step's rows: padding, skips, a device's slice, counts
    _reader        one step's host rows: source, padding, records, transform, checks, mask
    _window        what one window of the consumer's steps measured, which _climb judges by
    _store_waits   how long reads wait on a store behind a URL: the depth that hides it
    _trial         a depth on trial and how it is judged; inline against reading ahead
    _climb         how deep "auto" reads ahead: where it starts, when and how far it climbs
    _pipeline      steps read ahead on threads, depth adapting (Prefetcher), or on demand
    _placer        steps collected and placed on a few threads of their own (Placer)
    _replicas      check_replicas: a collective comparing replicas across processes
    _state         LoaderState: steps consumed and the fingerprint, to and from JSON
    _stream        Stream: the position, the steps read ahead, placed and handed out in order
    _stats         PipelineStats: what each stage did, for loader.stats()
    _assembly      assemble: a loader's parts wired from its options
    _loader        Loader: the façade over all of the above
    _pod           plan: the strategies' costs; with data, what a pod of hosts asks of its store

Users import these names from ``meshfeed``; this package exports nothing of its own.
"""

__all__: list[str] = []
