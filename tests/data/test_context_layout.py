"""Context layouts made on the host (``meshfeed.sources.context_layout``): the peers'
permutations, every strategy bit for bit, a device reading only its own slice, resume
under another cp, the loss of a row in any layout, and real processes."""

from __future__ import annotations

from collections.abc import Mapping

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import context_fns
import meshfeed
from context_fns import BATCH, SEQ_LEN, loader, packed, sharding
from meshfeed.core._context_layout import ContextKind
from meshfeed.data._pack_cut import read_packed_at
from meshfeed.sources import FieldSpec, PartialRows, context_layout
from meshfeed.testing import assert_resumes_identically, run_in_processes
from meshfeed.train import restore_order

STRATEGIES = ("global", "per_device", "per_process", "reshard")


# The peers' permutations, written from their definitions (research notes, sections 1-2).
def maxtext_reorder_sequence(x, cp_size, seq_dim=1, to_contiguous=False):
    """MaxText ``max_utils.reorder_sequence`` in numpy. MaxText refuses odd ``cp_size``
    (``cp_size % 2``); nothing in the permutation needs it, and meshfeed takes any cp,
    so that one check is left out here (cp=1 is then the identity, as in TE)."""
    seq_len = x.shape[seq_dim]
    group_size = seq_len // (2 * cp_size)
    if seq_len % (cp_size * 2) != 0:
        raise ValueError(f"{x.shape=} is not a multiple of {cp_size * 2=}")
    shape = x.shape
    reshaped = x.reshape(*shape[:seq_dim], 2 * cp_size, group_size, *shape[seq_dim + 1 :])
    swapped = np.swapaxes(reshaped, 0, seq_dim)
    if not to_contiguous:
        first_half, second_half = np.split(swapped, 2, axis=0)
        stacked = np.stack([first_half, second_half[::-1, ...]], axis=1)
        permuted = stacked.reshape(2 * cp_size, *swapped.shape[1:])
    else:
        first_half = swapped[0::2, ...]
        second_half = swapped[1::2, ...][::-1, ...]
        permuted = np.concatenate([first_half, second_half], axis=0)
    return np.swapaxes(permuted, 0, seq_dim).reshape(shape)


def te_reorder_causal_striped(x, cp_size, seq_dim, is_inverse, stripe_size=1):
    """Transformer Engine ``reorder_causal_striped`` in numpy."""
    shape = x.shape
    if stripe_size <= 0 or shape[seq_dim] % (cp_size * stripe_size) != 0:
        raise ValueError(f"{shape[seq_dim]=} is not a multiple of {cp_size * stripe_size=}")
    outer = shape[seq_dim] // (cp_size * stripe_size)
    middle = [cp_size, outer] if is_inverse else [outer, cp_size]
    striped = x.reshape(*shape[:seq_dim], *middle, stripe_size, *shape[seq_dim + 1 :])
    return np.swapaxes(striped, seq_dim, seq_dim + 1).reshape(shape)


def _rows(length: int, n: int = 3) -> meshfeed.ArraySource:
    """``n`` rows of ``length`` tokens (value = row * 1000 + position), with a field
    ``[length, 2]``, a row-describing ``seq_lens`` ``[3]`` and a label."""
    tokens = (np.arange(n)[:, None] * 1000 + np.arange(length)).astype(np.int32)
    return meshfeed.ArraySource(
        {
            "tokens": tokens,
            "segment_ids": np.ones((n, length), np.int32),
            "pairs": np.stack([tokens, -tokens], axis=-1),
            "seq_lens": np.tile(np.array([length, -1, -1], np.int32), (n, 1)),
            "label": np.arange(n),
        }
    )


DUAL = [(16, 1), (16, 2), (32, 2), (16, 4), (48, 4), (24, 3)]
STRIPED = [(16, 1, 1), (16, 2, 2), (16, 4, 1), (32, 4, 2), (12, 3, 1), (24, 3, 2), (32, 2, 8)]


@pytest.mark.parametrize(("length", "cp"), DUAL)
def test_dual_chunk_is_maxtexts_reorder_sequence_and_restore_order_undoes_it(length, cp):
    source = _rows(length)
    ids = np.array([2, 0])
    laid = context_layout(source, cp)[ids]
    for name in ("tokens", "segment_ids", "pairs"):
        want = maxtext_reorder_sequence(source[ids][name], cp)
        np.testing.assert_array_equal(laid[name], want)
        np.testing.assert_array_equal(
            maxtext_reorder_sequence(want, cp, to_contiguous=True), source[ids][name]
        )
        back = restore_order(np.asarray(laid[name]), cp)
        np.testing.assert_array_equal(np.asarray(back), source[ids][name])
    for name in ("seq_lens", "label"):  # not [T, ...]: the row's own description
        np.testing.assert_array_equal(laid[name], source[ids][name])


@pytest.mark.parametrize(("length", "cp", "stripe"), STRIPED)
def test_striped_is_transformer_engines_and_restore_order_undoes_it(length, cp, stripe):
    source = _rows(length)
    ids = np.array([1, 2])
    laid = context_layout(source, cp, "striped", stripe)[ids]
    for name in ("tokens", "pairs"):
        want = te_reorder_causal_striped(source[ids][name], cp, 1, False, stripe)
        np.testing.assert_array_equal(laid[name], want)
        back = te_reorder_causal_striped(want, cp, 1, True, stripe)
        np.testing.assert_array_equal(back, source[ids][name])
        got = restore_order(jnp.asarray(laid[name]), cp, "striped", stripe)
        np.testing.assert_array_equal(np.asarray(got), source[ids][name])


def test_the_source_passes_the_wrapped_one_through():
    rows = packed()
    laid = context_layout(rows, 4, "striped", 2)
    assert len(laid) == len(rows) and laid.fields == rows.fields
    assert laid.fingerprint == rows.fingerprint  # the same rows: a state moves between cps
    assert laid.seq_len == SEQ_LEN and laid.source is rows and laid.stats() == rows.stats()
    assert laid.sequence_fields == ("tokens", "weights", "segment_ids", "positions")
    assert laid.thread_safe and not laid.ordered and laid.pieces(3) == rows.pieces(3)
    assert not hasattr(laid, "read_into")  # would read rows in their own order
    assert isinstance(laid, meshfeed.Source) and isinstance(laid, PartialRows)
    assert not isinstance(laid, meshfeed.sources.Origins)  # the arrays say no origin
    one = laid[5]
    np.testing.assert_array_equal(one["tokens"], rows[5]["tokens"][laid.order])
    assert "cp=4, kind='striped', stripe=2" in repr(laid)


class _Counted:
    """Rows of a source, read whole (``__getitem__``) or in part (``read_at``): a
    ``PartialRows`` that keeps every position array it was asked for."""

    def __init__(self, source: meshfeed.Source, cut: bool) -> None:
        self._source, self.asked, self.whole, self.bad = source, [], 0, -1
        if cut:
            self.read_at = self._read_at
            self.sequence_fields = ("tokens", "segment_ids", "pairs")

    @property
    def fields(self) -> Mapping[str, FieldSpec]:
        return self._source.fields

    def __len__(self) -> int:
        return len(self._source)

    def __getitem__(self, ids):
        self.whole += 1
        return self._source[ids]

    def _read_at(self, ids, at):
        if self.bad in ids:
            raise ValueError(f"example {self.bad} is bad")
        self.asked.append(at)
        rows = self._source[ids]
        return {k: v[:, at] if k in self.sequence_fields else v for k, v in rows.items()}


@pytest.mark.parametrize("cut", [True, False])
def test_read_at_is_a_slice_of_the_laid_out_rows_and_asks_only_its_positions(cut):
    inner = _Counted(_rows(24, n=5), cut)
    laid = context_layout(inner, 3, "striped")
    ids = np.array([4, 1, 1])
    whole = laid[ids]
    for at in (np.arange(8, 16), np.array([23, 0, 5])):
        part = laid.read_at(ids, at)
        for name in whole:
            want = whole[name][:, at] if name in laid.sequence_fields else whole[name]
            np.testing.assert_array_equal(part[name], want)
    if cut:  # the wrapped source was asked only the positions that map to [8, 16)
        np.testing.assert_array_equal(inner.asked[0], laid.order[8:16])
        assert inner.whole == 1  # laid[ids] itself
    nested = context_layout(laid, 2)  # a layout of a layout delegates again
    at = np.arange(6)
    np.testing.assert_array_equal(nested.read_at(ids, at)["pairs"], nested[ids]["pairs"][:, at])


def test_a_packed_row_read_in_part_reads_only_the_documents_that_reach_it():
    rows = packed()
    asked: list[np.ndarray] = []

    class Docs:
        fields = rows.source.fields

        def __len__(self):
            return len(rows.source)

        def __getitem__(self, ids):
            asked.append(np.asarray(ids))
            return rows.source[ids]

    ids = np.array([0, 7, 3, len(rows) - 1])
    dtypes = {"tokens": np.dtype(np.int32), "weights": np.dtype(bool)}
    whole = rows[ids]
    layouts: list[tuple[ContextKind, int]] = [("dual_chunk", 1), ("striped", 1), ("striped", 4)]
    for kind, stripe in layouts:
        order = context_layout(rows, 4, kind, stripe).order
        for device in range(4):
            at = order[device * 8 : (device + 1) * 8]
            cut = read_packed_at(Docs(), rows.plan, dtypes, SEQ_LEN, ids, at)
            for name, values in cut.values.items():
                np.testing.assert_array_equal(values, whole[name][:, at])
            np.testing.assert_array_equal(cut.segment_ids, whole["segment_ids"][:, at])
            np.testing.assert_array_equal(cut.positions, whole["positions"][:, at])
    # Each device's documents are those of its slice: fewer than a row's, all of them
    # together a row's.
    asked.clear()
    for device in range(4):
        read_packed_at(
            Docs(), rows.plan, dtypes, SEQ_LEN, ids, np.arange(device * 8, device * 8 + 8)
        )
    row_docs = {d for row in ids for d, _, _ in rows.pieces(int(row))}
    assert set(np.concatenate(asked).tolist()) == row_docs
    assert max(len(a) for a in asked) < len(row_docs)


def test_documents_that_do_not_align_are_refused_in_part_too():
    docs = meshfeed.ArraySource(
        {
            "tokens": meshfeed.Ragged.from_list([np.arange(5), np.arange(7)], dtype=np.int32),
            "weights": meshfeed.Ragged.from_list([np.ones(5), np.ones(6)], dtype=bool),
        }
    )
    rows = meshfeed.pack(docs, 16)
    dtypes = {"tokens": np.dtype(np.int32), "weights": np.dtype(bool)}
    with pytest.raises(ValueError, match="field 'weights' has documents of other lengths"):
        read_packed_at(docs, rows.plan, dtypes, 16, np.array([0]), np.arange(4))


def _global(batch: dict[str, jax.Array]) -> dict[str, np.ndarray]:
    return {k: np.asarray(v) for k, v in batch.items()}


def test_every_strategy_gives_the_laid_out_rows_bit_for_bit_and_per_device_reads_its_slice():
    rows = packed()
    order = context_layout(rows, 4).order
    streams, stats = {}, {}
    for strategy in STRATEGIES:
        it = loader(strategy)
        streams[strategy] = [_global(meshfeed.reshard(b, it.sharding)) for b in it]
        stats[strategy] = it.stats()["source"]
        for step, batch in enumerate(streams[strategy]):
            want = rows[it.ids(step)]
            for name, values in batch.items():
                assert values.tobytes() == want[name][:, order].tobytes(), (strategy, name)
    steps = len(streams["global"])
    assert steps == len(rows) // BATCH
    for strategy in STRATEGIES:
        for a, b in zip(streams["global"], streams[strategy], strict=True):
            assert all(a[k].tobytes() == b[k].tobytes() for k in a)
    # A token of every packed field is 4 + 1 + 4 + 4 bytes. With per_device each of the 8
    # devices reads its 2 rows' 8 positions: 1/4 of each row, a whole batch in all.
    token = 13
    assert stats["per_device"]["reads"] == 8 * steps
    assert stats["per_device"]["bytes"] == 8 * steps * (BATCH // 2) * (SEQ_LEN // 4) * token
    assert stats["per_device"]["bytes"] == stats["per_process"]["bytes"]
    # A transform sees whole records: each device reads its rows whole, 4 times as much.
    whole = loader("per_device", transform=lambda b: b)
    again = [_global(meshfeed.reshard(b, whole.sharding)) for b in whole]
    assert whole.stats()["source"]["bytes"] == 4 * stats["per_device"]["bytes"]
    for a, b in zip(streams["global"], again, strict=True):
        assert all(a[k].tobytes() == b[k].tobytes() for k in a)


def _split() -> dict[str, jax.sharding.NamedSharding]:
    """``_rows``' fields on a data x context mesh: each row's tokens over 4 devices, a
    row's description whole."""
    split = sharding(4)
    rows = jax.sharding.NamedSharding(split.mesh, jax.sharding.PartitionSpec("data"))
    return {"tokens": split, "segment_ids": split, "pairs": split, "seq_lens": rows, "label": rows}


def test_per_device_asks_the_source_only_each_devices_positions():
    inner = _Counted(_rows(16, n=10), cut=True)
    laid = context_layout(inner, 4, "striped")
    loader = meshfeed.Loader(
        laid, global_batch_size=4, sharding=_split(), strategy="per_device", prefetch=0,
        last_batch="pad",
    )  # fmt: skip
    batches = [_global(b) for b in loader]
    # 10 rows in 3 steps of 4: the last step's rows 2 and 3 are padding, and the 4
    # devices holding only those read nothing.
    assert len(batches) == 3 and inner.whole == 0 and len(inner.asked) == 8 * 3 - 4
    assert {tuple(a) for a in inner.asked} == {
        tuple(laid.order[i * 4 : i * 4 + 4]) for i in range(4)
    }
    for step, batch in enumerate(batches):
        ids = loader.ids(step)
        want = laid[ids[ids >= 0]]
        for name, values in want.items():
            assert batch[name].shape == (4, *inner.fields[name].shape)
            np.testing.assert_array_equal(batch[name][ids >= 0], values)
            assert not batch[name][ids < 0].any()
    np.testing.assert_array_equal(batches[-1]["mask"], [True, True, False, False])


def test_a_bad_row_read_in_part_is_skipped_as_a_whole_one_is():
    inner = _Counted(_rows(16, n=8), cut=True)
    inner.bad = 5
    loader = meshfeed.Loader(
        context_layout(inner, 4), global_batch_size=4, sharding=_split(),
        strategy="per_device", prefetch=0, on_error="skip",
    )  # fmt: skip
    batches = [_global(b) for b in loader]
    assert {s.example for s in loader.skipped} == {5}
    for step, batch in enumerate(batches):
        ids = loader.ids(step)
        assert np.array_equal(batch["mask"], ids != 5)
        assert not batch["tokens"][ids == 5].any()


@pytest.mark.parametrize("strategy", ["per_device", "per_process"])
def test_a_state_resumes_exactly_and_under_another_cp(strategy):
    assert assert_resumes_identically(lambda: loader(strategy), max_steps=4) == 4
    first = loader(strategy, cp=4)
    it = iter(first)
    for _ in range(3):
        next(it)
    state = first.state()
    rest = [restore_order(b["tokens"], 4) for b in it]
    other = loader(strategy, cp=2, kind="striped")
    other.restore(state)
    again = [restore_order(b["tokens"], 2, "striped") for b in other]
    assert len(again) == len(rest) > 0
    for a, b in zip(rest, again, strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def _loss(batch: Mapping[str, jax.Array]) -> jax.Array:
    """A row's next-token loss through one causal attention layer inside each document,
    the mask from segment ids and positions (so any order of the tokens gives it)."""
    vocab, width = 64, 8
    keys = jax.random.split(jax.random.key(0), 2)
    embed = jax.random.normal(keys[0], (vocab, width))
    x = embed[batch["tokens"] % vocab]
    seg, pos = batch["segment_ids"], batch["positions"]
    mask = (seg[:, :, None] == seg[:, None, :]) & (pos[:, None, :] <= pos[:, :, None])
    scores = jnp.where(mask & (seg[:, :, None] > 0), x @ jnp.swapaxes(x, 1, 2), -1e9)
    logits = jax.nn.softmax(scores, axis=-1) @ x @ embed.T
    losses = -jnp.take_along_axis(
        jax.nn.log_softmax(logits), (batch["targets"] % vocab)[..., None], axis=-1
    )[..., 0]
    return jnp.sum(jnp.where(batch["weights"], losses, 0.0), axis=1)


def test_a_rows_loss_is_the_same_in_its_layout():
    rows = packed()
    every = rows[np.arange(8)]
    # Targets are the next token in the same document, made in the row's own order.
    targets = np.roll(every["tokens"], -1, axis=1)
    same = np.roll(every["segment_ids"], -1, axis=1) == every["segment_ids"]
    source = meshfeed.ArraySource(
        {**every, "targets": targets, "weights": same & (every["segment_ids"] > 0)}
    )
    own = _loss({k: jnp.asarray(v) for k, v in source[np.arange(8)].items()})
    layouts: list[tuple[int, ContextKind]] = [(4, "dual_chunk"), (2, "striped")]
    for cp, kind in layouts:
        it = meshfeed.Loader(
            context_layout(source, cp, kind), global_batch_size=8, sharding=sharding(cp),
            strategy="per_device", shuffle=False, prefetch=0,
        )  # fmt: skip
        laid = _loss({k: jnp.asarray(np.asarray(v)) for k, v in next(iter(it)).items()})
        np.testing.assert_allclose(np.asarray(laid), np.asarray(own), rtol=1e-5)


@pytest.mark.multiprocess
def test_two_processes_agree_with_one():
    strategies = ("per_device", "per_process")
    one = context_fns.run_strategies(strategies)
    two = run_in_processes(context_fns.run_strategies, strategies, num_processes=2)
    want = context_fns.assemble([one["per_device"]])
    for strategy in strategies:
        for r in two:  # every process computes the same steps on its own
            assert all(
                np.array_equal(a, b)
                for a, b in zip(r[strategy]["ids"], one[strategy]["ids"], strict=True)
            )
        got = context_fns.assemble([r[strategy] for r in two])
        assert len(got) == len(want) > 0
        for a, b in zip(want, got, strict=True):
            assert all(a[k].tobytes() == b[k].tobytes() for k in a), strategy


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (
            lambda: context_layout(np.zeros((4, 8)), 2),  # type: ignore[arg-type]
            TypeError,
            "takes a meshfeed.Source",
        ),
        (
            lambda: context_layout(meshfeed.ArraySource({"x": np.zeros((4, 8))}), 2),
            ValueError,
            r"needs rows of a known length.*context_layout\(meshfeed.pack\(source, seq_len\), cp\)",
        ),
        (
            lambda: context_layout(_NoRows(), 2),
            ValueError,
            r"found no field of shape \[8, \.\.\.\]",
        ),
        (
            lambda: context_layout(_rows(20), 4),
            ValueError,
            r"rows of 20 tokens do not split .*seq_len=16 or 24",
        ),
        (
            lambda: context_layout(_rows(20), 3, "striped", 2),
            ValueError,
            "or use another cp or stripe",
        ),
        (lambda: context_layout(_rows(16), 0), ValueError, r"cp=0 must be an int >= 1"),
        (
            lambda: context_layout(_rows(16), 2, "ring"),  # type: ignore[arg-type]
            ValueError,
            "kind='ring' is not a context layout",
        ),
        (
            lambda: context_layout(_rows(16), 2, stripe=2),
            ValueError,
            "stripe=2 is for kind='striped'",
        ),
        (lambda: context_layout(_rows(16), 2, "striped", 0), ValueError, "stripe=0 must be an int"),
        (
            lambda: context_layout(_rows(16), 2).read_at(np.array([0]), np.array([[1]])),
            IndexError,
            "must be a 1-D array",
        ),
        (
            lambda: context_layout(_rows(16), 2).read_at(np.array([0]), np.array([16])),
            IndexError,
            r"positions must be in \[0, 16\)",
        ),
        (
            lambda: context_layout(_rows(16), 2).read_at(np.array([3]), np.array([1])),
            IndexError,
            r"ids must be in \[0, 3\)",
        ),
    ],
)
def test_bad_arguments_are_refused_at_construction_naming_the_fix(call, error, match):
    with pytest.raises(error, match=match):
        call()


class _NoRows:
    """A source with a seq_len but no field of that length."""

    seq_len = 8

    @property
    def fields(self) -> Mapping[str, FieldSpec]:
        return {"x": FieldSpec((4,), np.dtype(np.int32))}

    def __len__(self):
        return 2

    def __getitem__(self, ids):
        return {"x": np.zeros((len(ids), 4), np.int32)}
