"""Sequence packing as a source: documents packed into fixed rows, served by index.

``pack(source, seq_len)`` plans once (``_pack_plan``) which pieces of which documents go
in which row, from the documents' lengths alone, and then serves rows by index like any
source. So the schedule shuffles, shards and resumes packed rows exactly as it does
examples, on any number of processes: every process computes the same plan from the
same lengths, and the loader's state is still a step number. (Grain packs online; its
state holds the open bins, so it cannot move to another process count.)

A packed row has ``field`` (``[seq_len]``: the documents' tokens one after another,
zeros in padding), ``segment_ids`` (1, 2, ... for the documents of the row in order, in
runs, 0 only for the padding at its tail) and ``positions`` (0 at each document's start,
0 in padding): the form splash attention, Transformer Engine and
``meshfeed.train.packed_attention`` take. With ``max_segments=S`` and ``seq_lens=True`` a
row also carries ``seq_lens`` ``[S]`` (each document's length) and ``seq_starts``
``[S+1]`` (each one's start, then the end of the last), ``int32`` and ``-1`` in unused
slots: the form cuDNN's packed path and Transformer Engine's ``SequenceDescriptor`` take.
Other ragged fields of the source -- a loss mask, say -- are packed alongside under their
own names, and must have the same lengths as ``field``.

Kernels that take lengths and starts compile for a static count of documents a row, so
a long row without ``max_segments`` is said on stderr, once a process.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

from meshfeed.cluster._ray_connect import import_ray
from meshfeed.data._pack_build import EXECUTORS, PlanExecutor
from meshfeed.data._pack_fields import (
    packed_fields,
)
from meshfeed.data._pack_plan import (
    ALGORITHMS,
    LONG_DOCS,
    WINDOWS,
    Algorithm,
    LongDocs,
    plan_packing,
)
from meshfeed.data._pack_store import location, open_plan
from meshfeed.data._packed import Packed
from meshfeed.data._row_cost import Balance, check_balance
from meshfeed.data._sources import (
    Source,
    document_lengths,
)

LONG_ROW = 4096
"""Rows this long or longer without ``max_segments`` are said (the module docstring)."""
_SAID: set[int] = set()  # row lengths said to have no static count of documents
LOSS_MASK = "loss_mask"  # what prepare(chat=) writes beside the tokens: long ones truncate


def _count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def pack(
    source: Source,
    seq_len: int,
    *,
    field: str = "tokens",
    seed: int = 0,
    algorithm: Algorithm = "best_fit",
    window: int | None = None,
    long_docs: LongDocs | None = None,
    max_segments: int | None = None,
    seq_lens: bool = False,
    balance: Balance | None = None,
    token_cost: float = 0.0,
    step_rows: int | None = None,
    alongside: Sequence[str] | None = None,
    plan_dir: str | os.PathLike[str] | bool | None = None,
    rebuild_plan: bool = False,
    plan_workers: int = 1,
    plan_executor: PlanExecutor = "local",
) -> Packed:
    """The documents of ``source`` packed into rows of ``seq_len`` tokens: a ``Source``.

    Load the result like any source -- ``Loader(pack(src, 512), global_batch_size=32,
    sharding=NamedSharding(mesh, P('data', None)))`` -- with every strategy, ``mix``,
    ``state()``/``restore()`` on another number of processes, and checkpoints.

    Args:
      source: a source whose ``field`` is ragged (documents of any length); its other
        fields must be ragged too, with the same lengths, and are packed alongside.
      seq_len: tokens per row.
      field: the field whose documents are packed.
      seed: the key of the order documents are taken in. A source that must be read in
        order (a mixture with stages, bound with ``mix(..., global_batch_size=)``) is
        packed in its own order instead, and the packed rows must be read in order too
        (``Loader(shuffle=False)``); its stages then fall on the rows about where their
        documents do (within a window). For stages at exact steps, mix packed sources:
        ``mix([pack(a, n), pack(b, n)], weights=stages)``.
      algorithm: ``"best_fit"`` or ``"first_fit"`` (each piece, as it comes, into the
        fullest or the first row it fits), or ``"best_fit_decreasing"``: each window's
        pieces longest first, each into the fullest row it fits -- the least padding (on
        BERT's lengths at a window of 16,384: 0.07% on Wikipedia at 512 and 2.3% on SQuAD
        at 384, where ``"best_fit"`` pads 0.75% and 5.8%; with a window that holds the
        whole set, as few rows as Graphcore's LPFHP), at about 0.5 us a document. With
        ``max_segments`` each window also tries its pieces as they come and keeps the
        fewer rows (a cap that binds leaves the short pieces, taken last, rows of their
        own). ``"best_fit"`` stays the default, so plans kept and states saved before
        go on as they were; pass ``"best_fit_decreasing"`` for new runs.
      window: documents planned together. Default: 16,384; 1,048,576 for
        ``"best_fit_decreasing"``, which fills more the more a window holds at no more
        time a document (``"best_fit"`` takes longer a document as its window grows).
      long_docs: a document longer than ``seq_len``: ``"split"`` into pieces (positions
        restart at 0 in every piece, as if each were a document of its own),
        ``"truncate"`` to its first ``seq_len`` tokens, ``"drop"``, or ``"error"``.
        Default: ``"truncate"`` for documents that carry a ``loss_mask`` (conversations:
        a piece would train on an answer without its question; TRL truncates too),
        ``"split"`` for others. ``packed.stats()`` counts what was split, truncated or
        dropped.
      max_segments: at most this many documents (pieces) in a row: the static count
        that kernels taking lengths and starts compile for (Transformer Engine's
        ``max_segments_per_seq``). Rows of ``4096`` tokens or more without it are said
        on stderr.
      seq_lens: with ``max_segments=S``, rows also carry ``seq_lens`` ``[S]`` and
        ``seq_starts`` ``[S+1]`` (the module docstring).
      balance: serve the rows in steps of even cost, the cost of a row as the attention
        kernel sees it: ``"pairs"`` (``Σ L(L+1)/2`` over its documents: kernels that skip
        work between documents, such as cuDNN, Transformer Engine, tokamax on GPU and
        ``meshfeed.train.packed_attention``), ``"static"`` (every row the cost of a full
        one: splash attention on TPU, where balancing reduces to padding), or a function
        of a row's document lengths. The loader then takes ``step_rows`` rows a step,
        spread over the data-parallel devices by cost. The rows are the plan's own (the
        same multiset an epoch): only which rows make a step changes.
      token_cost: with ``balance``, a cost per token added to each row's (the work that
        grows with tokens alone; about ``6 * d_model`` in pairs for a transformer).
      step_rows: with ``balance``, the rows of a step: the loader's
        ``global_batch_size``. Empty rows make the last step whole.
      alongside: the other fields packed with ``field`` (ragged, one value per token);
        default: every other field of the source. Fields not named are left out -- a
        per-document field such as an id, which a row of several documents has no
        place for.
      plan_dir: where the plan is kept. The plan depends on the documents' lengths and
        these settings only, so it is made once and read by every later ``pack`` on any
        host: for a meshfeed folder (``open_source``, local or a URL) it is kept in
        ``<folder>/meshfeed.pack/`` by default, built by the first ``pack`` (or ahead of
        the run: ``meshfeed pack FOLDER --seq-len N``), and read by range after that;
        a plan whose documents changed since is refused. A path or URL keeps it there
        instead (read-only data); ``False`` makes it in memory, as for other sources.
      rebuild_plan: build the kept plan again, over the one there.
      plan_workers: processes that build a kept plan not built yet (a shard of 16
        windows each at a time); a build stopped midway goes on from its done shards.
      plan_executor: ``"local"`` (``plan_workers`` processes on this machine) or
        ``"ray"``: a Ray task per shard on the cluster this process is connected to,
        else the one ``RAY_ADDRESS`` names, else a local Ray of its own (the ``ray``
        extra); the plan's place must then be reachable from every node (a URL or a
        shared file system), and a shard lost with its node is built again, the same
        bytes.

    Returns:
      A ``Packed`` source: fields ``field`` (and the other packed fields), ``segment_ids``
      and ``positions``, each ``[seq_len]`` (and ``seq_lens``, ``seq_starts``);
      ``packed.stats()`` tells the padding.
    """
    if not isinstance(source, Source):
        raise TypeError(f"pack takes a meshfeed.Source, got {type(source).__name__}.")
    if not _count(seq_len) or seq_len < 1:
        raise ValueError(f"seq_len={seq_len!r} must be an int >= 1 (tokens per packed row).")
    if algorithm not in ALGORITHMS:
        raise ValueError(f"algorithm={algorithm!r} is unknown; pass one of {list(ALGORITHMS)}.")
    if long_docs is not None and long_docs not in LONG_DOCS:
        raise ValueError(f"long_docs={long_docs!r} is unknown; pass one of {list(LONG_DOCS)}.")
    if window is None:
        window = WINDOWS[algorithm]
    if not isinstance(window, int) or not _count(window) or window < 1:
        raise ValueError(f"window={window!r} must be an int >= 1 (documents planned together).")
    if max_segments is not None and (not _count(max_segments) or max_segments < 1):
        raise ValueError(f"max_segments={max_segments!r} must be an int >= 1, or None.")
    if not isinstance(seq_lens, bool):
        raise TypeError(f"seq_lens={seq_lens!r} must be True or False.")
    if balance is not None:
        check_balance(balance, token_cost)
        if step_rows is None:
            raise ValueError(
                "balance= serves the rows in steps of even cost; pass step_rows= (the rows "
                "of a step: the loader's global_batch_size)."
            )
    if step_rows is not None and (not _count(step_rows) or step_rows < 1):
        raise ValueError(f"step_rows={step_rows!r} must be an int >= 1 (rows a step).")
    if step_rows is not None and balance is None:
        raise ValueError(
            f"step_rows={step_rows} groups rows into steps by their cost; pass balance= "
            "('pairs', 'static' or a function of a row's document lengths)."
        )
    if seq_lens and max_segments is None:
        raise ValueError(
            "seq_lens=True gives each row its documents' lengths and starts in a static "
            "number of slots; pass max_segments= (the most documents a row may hold)."
        )
    if not _count(seed) or seed < 0:
        raise ValueError(f"seed={seed!r} must be an int >= 0.")
    if not _count(plan_workers) or plan_workers < 1:
        raise ValueError(f"plan_workers={plan_workers!r} must be an int >= 1 (processes).")
    if plan_executor not in EXECUTORS:
        raise ValueError(
            f"plan_executor={plan_executor!r} must be 'local' (processes on this machine) "
            "or 'ray' (a Ray task per shard of the plan)."
        )
    if plan_executor == "ray":
        import_ray("pack(plan_executor='ray')")
    packed = packed_fields(source, field, alongside)
    if long_docs is None:  # never cut a masked document into a tail without its start
        long_docs = "truncate" if LOSS_MASK in packed else "split"
    if len(source) == 0:
        raise ValueError("source has 0 documents; pass a source with at least one.")
    settings = {
        "field": field,
        "seed": seed,
        "algorithm": algorithm,
        "window": window,
        "long_docs": long_docs,
        "max_segments": max_segments,
    }
    if alongside is not None:  # only when given: states of earlier loaders still restore
        settings["alongside"] = list(alongside)
    ordered = bool(getattr(source, "ordered", False))
    if ordered:  # documents in the source's own order: the seed orders nothing
        settings["ordered"] = True
    where = location(source, plan_dir)
    stored = None
    if where is not None:
        stored = open_plan(
            source,
            field,
            seq_len,
            settings,
            where,
            rebuild=rebuild_plan,
            workers=plan_workers,
            executor=plan_executor,
        )
    if max_segments is None and seq_len >= LONG_ROW and seq_len not in _SAID:
        _SAID.add(seq_len)
        sys.stderr.write(
            f"meshfeed: pack: rows of {seq_len} tokens hold any number of documents; kernels "
            "that take each row's lengths and starts (cuDNN, Transformer Engine) compile for "
            "a static count: pass max_segments= (and seq_lens=True) for them.\n"
        )
    balanced = None if balance is None else (balance, float(token_cost), int(step_rows or 1))
    if balance == "static":
        sys.stderr.write(
            "meshfeed: pack: balance='static': every row costs a full one to this kernel, so "
            "steps are even as they come; what is left to win is padding "
            "(packed.stats()['padding_fraction']).\n"
        )
    if stored is not None:
        stats = dict(stored.record["stats"])
        return Packed(source, seq_len, packed, stored, stats, settings, seq_lens, balanced)
    plan, stats = plan_packing(
        document_lengths(source, field),
        seq_len,
        seed=seed,
        ordered=ordered,
        algorithm=algorithm,
        window=window,
        long_docs=long_docs,
        max_segments=max_segments,
    )
    return Packed(source, seq_len, packed, plan, stats, settings, seq_lens, balanced)
