"""Storage: bytes of files, local or behind a URL, read by range through faults.

Everything a source needs to reach its bytes, and nothing of what the bytes mean: a
``Blob`` (one file, local or an object behind an fsspec URL, read by byte range), the
remote reads under it (ranges merged and requested together, failures named), the one
clock per store that decides how long an outage is outlived, the duplicate
requests that cut a store's slow tail, the local cache of whole
objects, the process's bounded pool of open files, the expansion of paths and globs, and
gzip / zstandard streams decompressed as they arrive. The sources of ``data/`` and
``formats/`` and the inputs of ``prepare/`` read through it; nothing here knows about
examples, fields or devices.

Modules, lowest first (each imports only modules listed before it)::

    _file_errors   BadFileError: a file its format cannot read, named (where in it, and why)
    _clock         StoreClock: a store's outage, timed once for all its reads; one probe at a time
    _hedge         Hedger: a store's recent latencies; a slow range read asked twice, in a budget
    _remote        byte ranges behind a URL: requested together, failures named, faults retried
    _cache         ShardCache: objects behind a URL kept whole on disk (LRU); LocalCopy: one open
    _handles       HANDLES: the process's open files, at most max_open_files, LRU closed first
    _expect        Expectation: a file's size, ETag and header from a catalog, checked at first read
    _blob          Blob: a local file or an object behind a URL, read by byte range
    _paths         expand_paths: paths, globs, braces and URLs in a fixed order; kinds by suffix
    _compressed    gzip and zstandard streams decompressed as they arrive, members on record

Users import these names from ``meshfeed``; this package exports nothing of its own.
"""

__all__: list[str] = []
