"""Packing: every token once per epoch, exact elastic resume, and masks that keep
attention inside each document."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import meshfeed
import pack_fns
from meshfeed.testing import run_in_processes
from multiprocess_fns import assemble


def _every_token() -> set[tuple[int, int]]:
    return {(i, p) for i, d in enumerate(pack_fns.documents()) for p in range(len(d))}


def _tokens_once(batches: list[dict[str, np.ndarray]]) -> None:
    seen = []
    for batch in batches:
        mask = batch["mask"]
        assert not batch["segment_ids"][~mask].any()  # padded rows are empty
        seen += pack_fns.check_rows({k: v[mask] for k, v in batch.items()})
    assert len(seen) == len(set(seen)), "a token appears twice"
    assert set(seen) == _every_token(), "a token is missing"


def test_every_token_appears_once_per_epoch_on_one_process():
    _tokens_once(assemble([pack_fns.epoch()]))


@pytest.mark.multiprocess
def test_every_token_appears_once_per_epoch_on_two_processes():
    _tokens_once(assemble(run_in_processes(pack_fns.epoch)))


def test_rows_match_the_plan_and_the_settings_hold():
    packed = pack_fns.packed(max_segments=2)
    rows = packed[np.arange(len(packed))]
    pack_fns.check_rows(rows)
    assert rows["segment_ids"].max() <= 2
    for r in (0, len(packed) - 1):
        pieces = packed.pieces(r)
        assert len(pieces) == rows["segment_ids"][r].max()
        doc, start, _ = pieces[0]
        assert rows["tokens"][r][0] == doc * pack_fns.SPAN + start
        assert sum(n for _, _, n in pieces) == (rows["segment_ids"][r] > 0).sum()
    stats = packed.stats()
    assert stats["tokens"] == sum(len(d) for d in pack_fns.documents())
    assert stats["padding"] == stats["rows"] * pack_fns.SEQ_LEN - stats["tokens"]
    assert stats["split_documents"] > 0 and stats["empty_documents"] > 0


def test_long_documents_truncate_or_drop_and_best_fit_pads_less():
    docs = pack_fns.documents()
    long = [d for d in docs if len(d) > pack_fns.SEQ_LEN]
    truncated = pack_fns.packed(long_docs="truncate")
    assert truncated.stats()["truncated_tokens"] == sum(len(d) - pack_fns.SEQ_LEN for d in long)
    pack_fns.check_rows(truncated[np.arange(len(truncated))])
    dropped = pack_fns.packed(long_docs="drop")
    assert dropped.stats()["dropped_documents"] == len(long)
    assert dropped.stats()["tokens"] == sum(len(d) for d in docs if len(d) <= pack_fns.SEQ_LEN)
    first = pack_fns.packed(algorithm="first_fit")
    pack_fns.check_rows(first[np.arange(len(first))])
    assert pack_fns.packed().stats()["padding"] <= first.stats()["padding"]


@pytest.mark.multiprocess
def test_the_plan_is_the_same_and_a_two_process_state_continues_exactly_on_one_and_four():
    whole = assemble([pack_fns.epoch()])
    first = run_in_processes(pack_fns.epoch, 3)
    state = first[0]["state"]
    assert state["step"] == 3 and all(r["state"] == state for r in first)
    on_one = assemble([pack_fns.epoch(None, state)])
    four = run_in_processes(pack_fns.epoch, None, state, num_processes=4, devices_per_process=2)
    # Each of the 2 and then the 4 processes made the plan that one process alone makes.
    assert {r["plan"] for r in first + four} == {pack_fns.plan_digest()}
    on_four = assemble(four)
    for rest in (on_one, on_four):
        assert len(rest) == len(whole) - 3
        for got, want in zip(rest, whole[3:], strict=True):
            for name in want:
                np.testing.assert_array_equal(got[name], want[name])


def test_a_packed_source_refuses_another_plans_state():
    mesh = meshfeed.make_mesh(data=8)
    sharding = NamedSharding(mesh, P("data", None))
    state = meshfeed.Loader(pack_fns.packed(), global_batch_size=8, sharding=sharding).state()
    other = meshfeed.Loader(pack_fns.packed(seed=1), global_batch_size=8, sharding=sharding)
    with pytest.raises(ValueError, match="the state is from another dataset: source="):
        other.restore(state)


def _model(seed: int = 0) -> dict[str, jax.Array]:
    k = jax.random.split(jax.random.key(seed), 5)
    d, vocab = 16, 64
    return {
        "embed": jax.random.normal(k[0], (vocab, d)) * 0.5,
        "position": jax.random.normal(k[1], (pack_fns.SEQ_LEN, d)) * 0.5,
        "qkv": jax.random.normal(k[2], (3, d, d)) * 0.3,
        "out": jax.random.normal(k[3], (d, vocab)) * 0.3,
    }


def _token_losses(params, tokens, positions, segment_ids) -> jax.Array:
    """Next-token cross-entropy of a one-layer attention model, per token."""
    x = params["embed"][tokens % 64] + params["position"][positions]
    q, k, v = (x @ params["qkv"][i] for i in range(3))
    scores = jnp.einsum("...qd,...kd->...qk", q, k) / 4.0
    scores = jnp.where(meshfeed.segment_mask(segment_ids), scores, -1e9)
    logits = (jax.nn.softmax(scores, -1) @ v) @ params["out"]
    targets = jnp.roll(tokens, -1, axis=-1) % 64
    losses = -jnp.take_along_axis(jax.nn.log_softmax(logits), targets[..., None], -1)[..., 0]
    # a token predicts the next one of its own document only
    same = (jnp.roll(segment_ids, -1, axis=-1) == segment_ids) & (segment_ids > 0)
    same = same.at[..., -1].set(False)
    return jnp.where(same, losses, 0.0)


def test_a_packed_row_with_segment_mask_scores_each_document_as_if_alone():
    packed = pack_fns.packed()
    params = _model()
    losses = jax.jit(_token_losses)
    rows = packed[np.arange(len(packed))]
    per_row = np.asarray(
        losses(params, rows["tokens"], rows["positions"], rows["segment_ids"])
    ).sum(axis=1, dtype=np.float64)
    # Each piece alone: its own row, the rest padding (segment 0).
    pieces = [p for r in range(len(packed)) for p in packed.pieces(r)]
    alone = np.zeros((3, len(pieces), pack_fns.SEQ_LEN), np.int32)  # tokens, positions, ids
    docs = pack_fns.documents()
    for i, (doc, start, length) in enumerate(pieces):
        alone[0, i, :length] = docs[doc][start : start + length]
        alone[1, i, :length] = np.arange(length)
        alone[2, i, :length] = 1
    per_piece = np.asarray(losses(params, *alone)).sum(axis=1, dtype=np.float64)
    assert isinstance(packed.plan, meshfeed.sources.PackPlan)  # in memory: an ArraySource
    counts = np.diff(packed.plan.row_starts)
    per_row_alone = np.add.reduceat(per_piece, np.cumsum(counts) - counts)
    np.testing.assert_allclose(per_row, per_row_alone, rtol=2e-5, atol=1e-4)
    assert per_row.min() > 0


def test_segment_mask_is_causal_inside_documents_and_empty_on_padding():
    mask = np.asarray(meshfeed.segment_mask(np.array([1, 1, 2, 2, 2, 0])))
    want = np.zeros((6, 6), bool)
    want[0, 0] = want[1, :2] = True
    want[2, 2] = want[3, 2:4] = want[4, 2:5] = True
    np.testing.assert_array_equal(mask, want)
    full = np.asarray(meshfeed.segment_mask(np.array([[1, 1, 0]]), causal=False))
    np.testing.assert_array_equal(full[0], [[1, 1, 0], [1, 1, 0], [0, 0, 0]])


def test_packed_sources_mix_and_load_with_every_strategy():
    mesh = meshfeed.make_mesh(data=4, model=2)
    sharding = NamedSharding(mesh, P("data", None))
    both = meshfeed.mix([pack_fns.packed(), pack_fns.packed(seed=3)], weights=[0.5, 0.5])
    for strategy in meshfeed.inspect.STRATEGIES:
        loader = meshfeed.Loader(both, global_batch_size=8, sharding=sharding, strategy=strategy)
        batch = meshfeed.reshard(next(iter(loader)), sharding)
        pack_fns.check_rows({k: np.asarray(v) for k, v in batch.items()})


def test_plot_packing_draws_the_rows(tmp_path):
    import matplotlib.image

    path = meshfeed.inspect.plot_packing(
        pack_fns.packed(), tmp_path / "packing.png", rows=5, dpi=60
    )
    image = matplotlib.image.imread(path)
    assert image.shape[0] > 100 and image[..., :3].std() > 0.05
    with pytest.raises(ValueError, match=r"must end in \.png or \.svg"):
        meshfeed.inspect.plot_packing(pack_fns.packed(), tmp_path / "packing.jpg")


def test_a_long_masked_document_is_truncated_by_default_never_split():
    """A conversation cut into pieces would train a tail's answer without its question:
    with a loss_mask the default keeps each document's start; without one it splits."""
    docs = [np.arange(n, dtype=np.int32) for n in (5, 20, 3)]
    masks = [np.arange(n) >= 2 for n in (5, 20, 3)]  # the answer after a 2-token prompt
    chats = meshfeed.ArraySource({
        "tokens": meshfeed.Ragged.from_list(docs),
        "loss_mask": meshfeed.Ragged.from_list(masks),
    })  # fmt: skip
    packed = meshfeed.pack(chats, 8)
    stats = packed.stats()
    assert stats["truncated_documents"] == 1 and stats["truncated_tokens"] == 12
    assert stats["split_documents"] == 0
    rows = packed[np.arange(len(packed))]
    assert rows["positions"].max() == 7  # every piece starts its document
    (r, c), *_ = np.argwhere(rows["tokens"] == 7)  # only the long one reaches token 7
    long = rows["segment_ids"][r] == rows["segment_ids"][r, c]
    np.testing.assert_array_equal(rows["tokens"][r][long], np.arange(8))  # its start, kept
    np.testing.assert_array_equal(rows["loss_mask"][r][long], np.arange(8) >= 2)
    split = meshfeed.pack(chats, 8, long_docs="split")  # by name, still there
    assert split.stats()["split_documents"] == 1
    plain = meshfeed.pack(meshfeed.ArraySource({"tokens": meshfeed.Ragged.from_list(docs)}), 8)
    assert plain.stats()["split_documents"] == 1 and plain.stats()["truncated_documents"] == 0


def test_alongside_packs_the_named_fields_and_leaves_per_document_ones_out():
    docs = [np.arange(n, dtype=np.int32) for n in (5, 3, 7, 2)]
    source = meshfeed.ArraySource({
        "tokens": meshfeed.Ragged.from_list(docs),
        "loss_mask": meshfeed.Ragged.from_list([d % 2 for d in docs]),
        "id": np.arange(4),
    })  # fmt: skip
    with pytest.raises(ValueError, match=r"field 'id' has a fixed shape .* alongside=\[...\]"):
        meshfeed.pack(source, 8)
    both = meshfeed.pack(source, 8, alongside=["loss_mask"])
    assert set(both.fields) == {"tokens", "loss_mask", "segment_ids", "positions"}
    rows = both[np.arange(len(both))]
    np.testing.assert_array_equal(rows["loss_mask"], rows["tokens"] % 2 * (rows["segment_ids"] > 0))
    alone = meshfeed.pack(source, 8, alongside=[])
    assert set(alone.fields) == {"tokens", "segment_ids", "positions"}
    np.testing.assert_array_equal(alone[np.arange(len(alone))]["tokens"], rows["tokens"])
    with pytest.raises(ValueError, match=r"alongside=\['label'\] names \['label'\], not other"):
        meshfeed.pack(source, 8, alongside=["label"])


def test_lengths_and_starts_in_static_slots_give_the_segment_ids_back(capsys):
    rng = np.random.default_rng(3)
    seq_len, slots = 64, 5
    lengths = [*rng.integers(1, seq_len + 1, 40), seq_len, seq_len, 3 * seq_len + 5]
    docs = meshfeed.Ragged.from_list([np.arange(n, dtype=np.int32) % 97 + 1 for n in lengths])
    packed = meshfeed.pack(
        meshfeed.ArraySource({"tokens": docs}), seq_len, max_segments=slots, seq_lens=True
    )
    rows = packed[np.arange(len(packed))]
    assert rows["seq_lens"].shape == (len(packed), slots)
    assert rows["seq_starts"].shape == (len(packed), slots + 1)
    for ids, lens, starts, positions in zip(
        rows["segment_ids"], rows["seq_lens"], rows["seq_starts"], rows["positions"], strict=True
    ):
        n = int((lens >= 0).sum())
        assert 1 <= n <= slots and (lens[:n] > 0).all() and (lens[n:] == -1).all()
        assert (starts[: n + 1] >= 0).all() and (starts[n + 1 :] == -1).all()
        assert starts[0] == 0 and (np.diff(starts[: n + 1]) == lens[:n]).all()
        assert starts[n] <= seq_len  # no row holds more than its tokens
        rebuilt = np.zeros(seq_len, np.int32)  # the runs, 1..n, padding 0 at the tail
        for k in range(n):
            rebuilt[starts[k] : starts[k + 1]] = k + 1
        np.testing.assert_array_equal(rebuilt, ids)
        np.testing.assert_array_equal(positions[: starts[n]], np.concatenate(
            [np.arange(length) for length in lens[:n]]))  # fmt: skip
    with pytest.raises(ValueError, match=r"seq_lens=True .* pass max_segments="):
        meshfeed.pack(meshfeed.ArraySource({"tokens": docs}), seq_len, seq_lens=True)
    capsys.readouterr()
    meshfeed.pack(meshfeed.ArraySource({"tokens": docs}), 4096, plan_dir=False)
    assert "rows of 4096 tokens hold any number of documents" in capsys.readouterr().err


def test_a_large_segment_mask_points_to_packed_attention(capsys):
    capsys.readouterr()
    shape = jax.eval_shape(
        meshfeed.segment_mask, jax.ShapeDtypeStruct((1, 4096), jnp.int32)
    )  # traced only: nothing that large is built
    assert shape.shape == (1, 4096, 4096)
    err = capsys.readouterr().err
    assert "[4096, 4096] booleans a row (16 MiB)" in err and "packed_attention" in err
