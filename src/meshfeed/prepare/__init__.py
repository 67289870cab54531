"""From raw text to tokens: ``prepare`` writes a meshfeed folder of token documents.

Text arrives as JSON Lines (plain, gzip, zstandard), Parquet, plain text or a Hugging
Face dataset; it leaves as a folder of parts whose ``tokens`` field is a ``Ragged``
document per record, ready for ``open_source`` and ``pack``. The work is cut into parts
from the inputs alone, so the output is the same bytes for one worker or many, one
machine or many (``--part i/N`` runs, Ray tasks); a part is done when its manifest is
written, so a killed build re-run redoes only what was not finished; the tokenizer's
content hash and fingerprint are on record, and ``open_source(tokenizer=...)`` refuses
a mismatch. This layer sits above the data (it writes folders with the data layer's
writer) and above the workers (its processes start bare, as record workers do).

Modules, lowest first (each imports only modules listed before it)::

    _inputs        the inputs (paths, globs, URLs, a dataset) and the parts they are cut into
    _read          a part's documents: JSON Lines (plain, gz, zst), text, Parquet, a dataset
    _encode        a part encoded (specials added, empties dropped) and written as a folder
    _worker        what a worker process runs: parts in, written parts out
    _run           the parts on local worker processes or Ray tasks, with progress
    _prepare       prepare and prepare_status: the plan on record, the runs, the completion

Users import these names from ``meshfeed``; this package exports nothing of its own.
"""

__all__: list[str] = []
