"""What each ``Loader`` option means: ``OPTION_DOCS``, one text an option.

The texts are the one place an option is explained: ``Loader``'s docstring gets its
``Args`` from them (``args_section``), and a test holds them to the signature and to
``LoaderOptions``, so a new option without its text (or a text left behind) fails.
"""

from __future__ import annotations

OPTION_DOCS: dict[str, str] = {
    "source": (
        "a ``meshfeed.Source`` (``len``, ``source[ids]``, ``fields``). A mixture "
        "with stages is bound to this loader's steps, and read in order (``shuffle=False``)."
    ),
    "global_batch_size": (
        "rows of one step over all processes; or stages ``[(0, 32), "
        "(1000, 64)]``, a batch size that ramps (the schedules guide: epochs then count "
        "examples, a step may straddle two, and a train step compiles once per size)."
    ),
    "sharding": (
        "a ``NamedSharding`` for every field, or a mapping field -> sharding. "
        "The batch dimension is the first; it must split evenly over its mesh axes."
    ),
    "strategy": (
        '``"per_process"`` (default), ``"global"``, ``"per_device"``, '
        '``"reshard"`` or ``"auto"`` (the strategies guide). With ``"reshard"`` '
        "batches arrive in ``loader.load_sharding``; move them with "
        "``meshfeed.reshard(batch, loader.sharding)``, inside or outside ``jax.jit``."
    ),
    "shuffle": ("a keyed random order per epoch; else ``0 .. N-1``."),
    "shuffle_block": (
        "shuffle blocks of this many consecutive examples, for data behind "
        "a URL: each step reads a few contiguous runs instead of one request per row "
        "(the object storage guide)."
    ),
    "shuffle_window": (
        "blocks visited together, round-robin, with ``shuffle_block`` "
        "(default 16): more mixes more, and each step reads about that many runs."
    ),
    "seed": ("the key of that order."),
    "num_epochs": ("passes over the source; ``None`` for endless."),
    "last_batch": (
        '``"drop"`` skips each epoch\'s final partial batch; ``"pad"`` fills it '
        "with zero rows and adds a boolean ``mask`` field (True for real rows)."
    ),
    "transform": (
        "a row-wise, vectorised function on the numpy dict of the rows a "
        "process loads, applied before they go to devices. It must keep the row count."
    ),
    "prefetch": (
        "steps read ahead (source, record transforms, ``transform``) on "
        'background threads, several at once. ``"auto"`` (default) reads the first '
        "steps together, starts at 2 (16 for a slow source) and moves by trials judged "
        "on the steps per second before and after: deeper while the loop waits on a "
        "slow source, shallower where depth does not pay, down to 0 (the loop reads "
        "each step itself, where a reader thread's hand-offs cost more than they hide: "
        "rows in memory, many small shards) while that runs faster "
        "(``loader.prefetch_depth`` says where it is, ``loader.stats()`` its moves and "
        "why); an int fixes it; "
        "0 reads each step on demand (record workers hold the steps read ahead). "
        "``state()`` counts only the batches handed out."
    ),
    "prefetch_bytes": ("the most bytes of batches read ahead (default 256 MiB)."),
    "place_threads": (
        "threads that collect steps from the record workers and place them "
        "on the devices ahead of the loop, so the loop's thread only takes finished "
        'steps (host-to-device copies on a GPU scale with threads). ``"auto"`` '
        "(default): none on CPU devices, where rows reach XLA without a copy, 4 "
        "elsewhere; an int fixes it (0: on the loop's thread)."
    ),
    "check_every": (
        "run ``meshfeed.check_replicas`` on every N-th batch (a collective that "
        "compares replicas across processes; raises ``ValueError`` if they differ)."
    ),
    "record_transform": (
        "``fn(record, rng) -> record`` run on every example a process "
        "loads (decode, augment), before ``transform``; ``record`` maps field -> that "
        "example's value, ``rng`` a generator seeded from ``(seed, epoch, example_id)``. "
        "Every output record must have the same fields, shapes and dtypes. Returning "
        "``None`` drops the example: its row is zeros with ``mask`` False (with a record "
        "transform the batches carry the ``mask`` field), the schedule unchanged, not an "
        "error; ``loader.filtered`` and ``stats()`` count them."
    ),
    "num_workers": (
        "workers for ``record_transform`` (0: in the loading thread). The "
        "output does not depend on it, nor on ``worker_type``."
    ),
    "worker_type": (
        '``"processes"`` (default): ``fn`` is sent to worker processes by '
        "value (cloudpickle), so it may come from a script, a notebook or a closure; "
        '``"threads"``: a thread pool in this process, for decoders that release the GIL; '
        '``"ray"`` (or ``meshfeed.RayOptions(...)``, what each reserves): Ray actors on '
        "the cluster this process is connected to, or ``RAY_ADDRESS``'s, or a local one; "
        "they read the source themselves, and a chunk lost with one is computed again."
    ),
    "on_error": (
        "what a bad record does -- a read of it that raises (anything but an "
        "``OSError``, which is the storage's: an outage, a missing file) or a "
        '``record_transform`` that raises on it. ``"raise"`` (default) ends the run; '
        '``"skip"`` makes it a zero row with ``mask`` False (the field is added, as by '
        '``last_batch="pad"``): every other row keeps its place, the batch its shape and '
        "the schedule its steps, whatever the workers or processes. ``loader.skipped`` "
        "lists them; ``state()`` counts them."
    ),
    "max_skipped": (
        'with ``"skip"``, the most examples this process may skip before the '
        "loader raises: a count (an int), or a fraction of the examples it read (a float; "
        "default 0.01, and never fewer than 100)."
    ),
}
"""Each argument of ``Loader(...)``, by name: what it does, in Google-style text."""


def args_section(indent: str = "    ") -> str:
    """The ``Args:`` section of a docstring, from ``OPTION_DOCS``, at ``indent``."""
    lines = [f"{indent}Args:"]
    for name, text in OPTION_DOCS.items():
        line = f"{indent}  {name}:"
        for word in text.split():
            if len(line) + 1 + len(word) > 88:
                lines.append(line)
                line = f"{indent}    {word}"
            else:
                line += f" {word}"
        lines.append(line)
    return "\n".join(lines) + "\n"
