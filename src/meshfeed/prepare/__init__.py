"""Work done once over a data set: ``prepare`` (raw text to token documents), ``select``,
``shard_images``.

Text arrives as JSON Lines (plain, gzip, zstandard), Parquet, plain text or a Hugging
Face dataset; it leaves as a folder of parts whose ``tokens`` field is a ``Ragged``
document per record, ready for ``open_source`` and ``pack``. The work is cut into parts
from the inputs alone, so the output is the same bytes for one worker or many, one
machine or many (``--part i/N`` runs, Ray tasks); a part is done when its manifest is
written, so a killed build re-run redoes only what was not finished; the tokenizer's
content hash and fingerprint are on record, and ``open_source(tokenizer=...)`` refuses
a mismatch. ``select`` is the same kind of work for a filter: a predicate run once
over a source, in parts, on worker processes or Ray tasks, resumable, its result (the
kept ids) cached by the data's and the predicate's fingerprints and served as a
``Selection``. ``shard_images`` writes an image folder as parts of one shard each, the
same way: planned on record, resumable, on worker processes or Ray tasks. This layer
sits above the data (it writes folders with the data layer's writer) and above the
workers (its processes start bare, as record workers do).

Modules, lowest first (each imports only modules listed before it)::

    _inputs        the inputs (paths, globs, URLs, a dataset) and the parts they are cut into
    _read          a part's documents: JSON Lines (plain, gz, zst), text, Parquet, a dataset
    _chat_batch    a batch of conversations through HF's own steps, the mask marked at once
    _chat_turns    a template without generation blocks: assistant spans from turn boundaries
    _chat          conversations to tokens and an assistant-only loss mask, as HF makes them
    _encode        a part encoded (specials added, empties dropped) and written as a folder
    _select_part   a part of a selection: the predicate over a run of examples, kept ids out
    _image_part    a part of an image shard build: images read, written as one shard
    _worker        what a worker process runs: parts in, written parts out
    _run           the parts on local worker processes or Ray tasks, with progress
    _arguments     prepare's arguments checked: the settings on record, how it runs
    _plan          prepare's plan: inputs listed, parts cut, on record (a re-run's checked)
    _prepare       prepare and prepare_status: the build's steps, the runs, the completion
    _select        select: a predicate run once over a source, cached, a Selection out
    _shard_images  shard_images: an image folder as shards read by range, resumable

Users import these names from ``meshfeed``; this package exports nothing of its own.
"""

__all__: list[str] = []
