"""Text to train on, and a tokenizer for it: the first of three commands from text to a model.

Writes Python's own standard library (it ships with Python: nothing is downloaded) as
JSON Lines -- one record per module, ``{"path": ..., "text": ...}``, split over 4 files
-- and trains a byte-level BPE tokenizer on it with Hugging Face ``tokenizers``
(``pip install 'meshfeed[text]'``). The three commands::

    python examples/lm_corpus.py /tmp/lm
    meshfeed prepare '/tmp/lm/corpus/*.jsonl' --tokenizer /tmp/lm/tokenizer.json \\
        --out /tmp/lm/tokens
    meshfeed launch -n 2 --devices-per-process 4 -- python examples/lm_train.py /tmp/lm

The docs guide "From text to batches" walks through them.
"""

import argparse
import json
import sysconfig
from pathlib import Path

try:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
except ImportError:  # the README's install is .[demo]; this example needs .[text]
    raise SystemExit(
        "lm_corpus.py trains its tokenizer with Hugging Face tokenizers: "
        "pip install -e '.[text]' (or pip install 'meshfeed[text]'), then run it again."
    ) from None

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("folder", type=Path, help="where corpus/ and tokenizer.json go")
parser.add_argument("--max-mb", type=float, default=8.0, help="text to write, in MB")
parser.add_argument("--vocab", type=int, default=4096, help="the tokenizer's vocabulary")
args = parser.parse_args()

stdlib = Path(sysconfig.get_paths()["stdlib"])
records, total = [], 0
for path in sorted(stdlib.rglob("*.py")):
    if "site-packages" in path.parts or total > args.max_mb * 1e6:
        continue
    text = path.read_text(errors="replace")
    records.append({"path": str(path.relative_to(stdlib)), "text": text})
    total += len(text.encode())

corpus = args.folder / "corpus"
corpus.mkdir(parents=True, exist_ok=True)
for k in range(4):
    with open(corpus / f"stdlib-{k}.jsonl", "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in records[k::4])
print(f"corpus: {len(records)} modules, {total / 1e6:.1f} MB of text in 4 JSON Lines files")

tokenizer = Tokenizer(models.BPE())
tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
tokenizer.decoder = decoders.ByteLevel()
trainer = trainers.BpeTrainer(
    vocab_size=args.vocab,
    special_tokens=["<|endoftext|>"],  # meshfeed prepare ends every document with it
    initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    show_progress=False,
)
tokenizer.train_from_iterator((r["text"] for r in records), trainer)
tokenizer.save(str(args.folder / "tokenizer.json"))
print(f"tokenizer: byte-level BPE, {tokenizer.get_vocab_size()} tokens")
