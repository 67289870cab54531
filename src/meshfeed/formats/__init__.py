"""Streaming formats read by index: WebDataset tar shards, JSON Lines, TFRecord.

Much of the data people train on sits in files made to be read front to back. Indexed
once -- a small sidecar of byte offsets per file, checked against the file's size and
modification time -- each sample becomes a byte range, and the sources here are ordinary
random-access sources: every strategy, any shuffle (``shuffle_block`` reads neighbouring
samples of a file as one request), ``mix``, ``pack``, per-process reads and the loader's
elastic restore. ``meshfeed.index`` builds the indexes (in parallel, resumable per file);
the sources read through the data layer's byte-range machinery, locally or behind URLs.

Modules, lowest first (each imports only modules listed before it)::

    _index         the index file: offsets per sample, the file's size and time; where it lives
    _restarts      one gzip stream with restart points: written, its table found, a segment read
    _members       compressed files by member: scanned as they decompress, read, rewritten
    _indexed       IndexedFiles: files, their indexes, samples numbered, byte-range reads
    _tar_keys      a tar shard's members grouped into samples by key, by loop or numpy
    _tar_scan      WebDataset tar shards indexed: headers walked, members grouped by key
    _tar           TarSource: samples of tar shards read by range, decoded
    _jsonl         JSON Lines, plain or in gzip/zstd members: lines scanned, JsonlSource
    _example       tf.train.Example parsed from the wire format, without TensorFlow; feature types
    _tfrecord      TFRecord: frames scanned, CRCs checked, records decoded, TFRecordSource
    _build         index: files indexed by bare worker processes, per file, resumable

Users import these names from ``meshfeed``; this package exports nothing of its own.
"""

__all__: list[str] = []
