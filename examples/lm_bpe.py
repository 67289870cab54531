"""Tokens from a BPE tokenizer trained here, packed into rows, on a sharded mesh.

Trains a byte-level BPE tokenizer (Hugging Face ``tokenizers``: ``pip install
'meshfeed[text]'``) on the first modules of Python's standard library -- nothing is
downloaded -- encodes each blank-line-separated block as a document, keeps the token
lists as ``meshfeed.Ragged``, packs them into rows of 128 tokens with ``meshfeed.pack``
and loads them split over 8 CPU devices, with the attention mask that keeps each token
inside its document. ``meshfeed demo --lm`` trains on the same kind of rows (bytes
instead of BPE tokens).

Run: ``python examples/lm_bpe.py``. Prints::

    vocabulary: 1000 tokens (BPE trained on the standard library)
    documents: ragged int32, lengths from offsets
    rows: 128 tokens, padding under 2%: True
    batch: tokens int32[16, 128] over P('data', None), with segment_ids and positions
    every piece starts at position 0 and stays in one segment: True
    attention mask: bool[16, 128, 128], block-diagonal and causal: True
"""

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import sysconfig
from pathlib import Path

import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

import meshfeed

# The text: blank-line-separated blocks of the first standard-library modules.
files = sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))[:40]
blocks = [b for f in files for b in f.read_text(errors="replace").split("\n\n") if b.strip()]

# A byte-level BPE tokenizer, trained on that text.
tokenizer = Tokenizer(models.BPE())
tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
tokenizer.decoder = decoders.ByteLevel()
trainer = trainers.BpeTrainer(
    vocab_size=1000, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
)
tokenizer.train_from_iterator(blocks, trainer)
print(f"vocabulary: {tokenizer.get_vocab_size()} tokens (BPE trained on the standard library)")

ids = [np.asarray(e.ids, np.int32) for e in tokenizer.encode_batch(blocks)]
source = meshfeed.ArraySource({"tokens": meshfeed.Ragged.from_list(ids)})
assert len(source.lengths("tokens")) == len(blocks)
print(f"documents: ragged {source.fields['tokens'].dtype}, lengths from offsets")

packed = meshfeed.pack(source, 128)
print(
    f"rows: {packed.seq_len} tokens, padding under 2%: {packed.stats()['padding_fraction'] < 0.02}"
)

mesh = meshfeed.make_mesh(data=8)
sharding = NamedSharding(mesh, P("data", None))
loader = meshfeed.Loader(packed, global_batch_size=16, sharding=sharding)
batch = next(iter(loader))
tokens = batch["tokens"]
print(
    f"batch: tokens {tokens.dtype}[{tokens.shape[0]}, {tokens.shape[1]}] over "
    f"{tokens.sharding.spec}, with segment_ids and positions"  # type: ignore[attr-defined]
)
segments, positions = np.asarray(batch["segment_ids"]), np.asarray(batch["positions"])
starts_a_piece = np.diff(segments, axis=1) != 0
follows = np.where(starts_a_piece, positions[:, 1:] == 0, positions[:, 1:] == positions[:, :-1] + 1)
steady = bool(np.all(follows | (segments[:, 1:] == 0)) and np.all(positions[:, 0] == 0))
print(f"every piece starts at position 0 and stays in one segment: {steady}")
mask = np.asarray(meshfeed.segment_mask(batch["segment_ids"]))
inside = segments[:, :, None] == segments[:, None, :]
causal = np.tril(np.ones((128, 128), bool))
exact = np.array_equal(mask, inside & causal & (segments[:, :, None] > 0))
shape = ", ".join(map(str, mask.shape))
print(f"attention mask: {mask.dtype}[{shape}], block-diagonal and causal: {exact}")
