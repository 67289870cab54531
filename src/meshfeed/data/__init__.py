"""Sources: random access to examples by integer ids, from wherever the data lives.

A source is ``len(source)`` and ``source[ids] -> {field: array}``, nothing more: the
schedule, the strategies and the loader above need no other access. This layer holds
every way to get one -- numpy arrays and memory maps, meshfeed's own folder of ``.npy``
shards (read by byte range, locally or from object storage through ``storage/``),
Parquet, Hugging Face datasets, Grain, PyTorch and ArrayRecord -- and the writer of
that folder. Variable-length fields are ``Ragged`` (flat values, offsets).
Mixtures and packing are sources built from sources, addressed by index like any other,
so resuming them needs nothing new. Nothing here knows about devices, steps or
training, and nothing renders.

Modules, lowest first (each imports only modules listed before it)::

    _ragged        Ragged: documents of any length, flat values and offsets
    _bad_records   what on_error="skip" skips; the bad examples of a failed read, by halves
    _sources       the Source protocol, FieldSpec; the ids check and the gather by part
    _nulls         nulls never read as numbers: fill= with a <field>_valid field, or refused
    _files         fixed-size rows by byte range: RowFile, .npy, ragged values + offsets, .npz
    _tokenizer     Tokenizer: an encoder with its identity (content hash, fingerprint, specials)
    _folder        the folder layout: manifests, part folders, a prepared folder's record
    _arrays        ArraySource: numpy arrays, memmaps read with pread
    _sharded       ShardedSource: .npy shards by byte range, each file checked at first read
    _manifest      a folder's manifest read and checked; each .npy it lists opened as it says
    _store         meshfeed's folder of .npy shards, read from its catalog: open_source
    _writer        write_source: one writer, or one part per worker
    _catalog       catalogs: what a host reads to start; written, upgraded, found from patterns
    _adapters      sources over records: Grain, PyTorch, ArrayRecord
    _arrow         Arrow columns as fields; Hugging Face datasets
    _parquet_files a Parquet file's footer: opened (encrypted ones refused), summarized, catalogued
    _parquet       ParquetSource: many files, a row group at a time, from their catalog
    _image_folder  ImageFolderSource: image files in class subfolders, listed once
    _selection     Selection: the examples of a source a predicate kept, as a source
    _mix_order     which source and which of its examples fill each position, by stage
    _mix           mix: sources in proportions fixed or by stage, addressed by index
    _row_cost      a packed row's cost as the attention kernel sees it: pairs, static, or yours
    _balance       balanced steps: rows of even cost a step, spread over the devices by cost
    _pack_fill     how a window's pieces fill rows: best fit, first fit, best fit decreasing
    _pack_plan     the packing plan: which piece of which document goes in which row
    _pack_build    a kept packing plan built, a shard of windows at a time, on workers too
    _pack_store    the packing plan as data: built once beside the documents, read by range
    _pack_fields   what a packed row holds: its fields checked; lengths and starts in static slots
    _pack_cut      packed rows read in part: only the documents that reach some positions
    _pack_balance  balanced steps over a plan: which plan row each served row is, kept as data
    _packed        Packed: a packing plan served as a source, row by row
    _pack          pack: documents packed into fixed rows, a source served by index
    _context_layout context_layout: every row's tokens laid out for a context mesh axis

Users import these names from ``meshfeed``; this package exports nothing of its own.
"""

__all__: list[str] = []
