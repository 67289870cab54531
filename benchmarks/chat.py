"""Workload V, conversations to tokens and an assistant-only mask: ``prepare(chat=)`` and peers.

Generated tool-calling conversations (JSON Lines, each with its ``tools``), a byte-level
BPE trained here as a ``transformers`` fast tokenizer, and two of TRL's templates:
Qwen2.5's own (no ``{% generation %}`` blocks: meshfeed's mask from turn boundaries) and
its training variant (with blocks). Each entry is given the loaded tokenizer, runs in a
fresh process, and is timed from reading the JSON Lines to every conversation's ids
(and masks): ``meshfeed.prepare(chat="messages", workers=2)`` against ``datasets``
(``from_json`` + a batched ``map`` of ``apply_chat_template``, ``num_proc=2``, in
memory: the peer at its best), ``datasets-rows`` (the map a record a call) and a plain
``loop``. Every entry's ids are hashed and must agree. Rotating rounds, the medians of
meshfeed's per-round ratios; goal >= 1.5x ``datasets``. ``--smoke`` for CI (100
conversations, meshfeed and ``datasets``, the last template).
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import os
import re
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from harness import arguments, emit, in_rounds, median_of, median_ratio, run_child

GENERATION = re.compile(r"\{%-?\s*generation\s*-?%\}")
ENTRIES = ("datasets", "datasets-rows", "loop", "meshfeed")
TEMPLATES = ("qwen2_5", "qwen2_5_training")
VOCABULARY = (
    "the a cat dog sat on mat weather today is sunny cold function call result héllo 日本語 😀"
    " city flight book price search find me please tomorrow morning"
)
WORDS = VOCABULARY.split()
TOOLS = ("weather", "flights", "hotels", "stocks", "search", "calendar")


def _tool(name: str) -> dict:
    query = {"type": "string", "description": f"what to look up in {name}"}
    parameters = {"type": "object", "required": ["query"], "properties": {"query": query}}
    description = f"Looks things up in {name}."
    function = {"name": name, "description": description, "parameters": parameters}
    return {"type": "function", "function": function}


def template(name: str) -> str:
    """One of the chat templates TRL keeps, by file name."""
    import trl

    return (Path(trl.__file__).parent / "chat_templates" / f"{name}.jinja").read_text()


def make_data(folder: Path, n: int) -> tuple[Path, Path]:
    """``n`` conversations as JSON Lines, and a tokenizer folder; their paths."""
    import numpy as np
    import tokenizers
    import transformers

    rng = np.random.default_rng(0)

    def text(most: int = 40) -> str:
        return " ".join(str(rng.choice(WORDS)) for _ in range(int(rng.integers(1, most))))

    data = folder / "chats.jsonl"
    samples = []
    with open(data, "w", encoding="utf-8") as f:
        for i in range(n):
            tools = [_tool(str(t)) for t in rng.choice(TOOLS, int(rng.integers(1, 4)), False)]
            system = [{"role": "system", "content": text()}] if rng.random() < 0.8 else []
            messages: list[dict] = list(system)
            for _ in range(int(rng.integers(1, 4))):
                messages.append({"role": "user", "content": text()})
                if rng.random() < 0.3:
                    name = tools[int(rng.integers(len(tools)))]["function"]["name"]
                    function = {"name": name, "arguments": {"query": text(6)}}
                    call = {"type": "function", "function": function}
                    messages.append({"role": "assistant", "content": "", "tool_calls": [call]})
                    messages.append({"role": "tool", "content": text()})
                messages.append({"role": "assistant", "content": text()})
            record = {"id": i, "messages": messages, "tools": tools}
            f.write(json.dumps(record, ensure_ascii=False) + "\n")
            if i < 200:
                samples.append(record)
    model = tokenizers.Tokenizer(tokenizers.models.BPE(unk_token="<unk>"))
    model.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    model.decoder = tokenizers.decoders.ByteLevel()
    specials = ["<unk>", "<|im_start|>", "<|im_end|>", "<|endoftext|>"]
    trainer = tokenizers.trainers.BpeTrainer(
        vocab_size=4000,
        special_tokens=specials,
        show_progress=False,
        initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet(),
    )
    corpus = [template(TEMPLATES[0]), *(json.dumps(r, ensure_ascii=False) for r in samples)]
    model.train_from_iterator(corpus * 5, trainer)
    hf = transformers.PreTrainedTokenizerFast(
        tokenizer_object=model,
        unk_token="<unk>",
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=["<|im_start|>"],
    )
    hf.save_pretrained(folder / "tokenizer")
    return data, folder / "tokenizer"


def _digest(ids: list, masks: list | None) -> str:
    import numpy as np

    h = hashlib.sha256()
    for i, one in enumerate(ids):
        h.update(np.asarray(one, np.int64).tobytes() + b"|")
        if masks is not None:
            h.update(np.asarray(masks[i], bool).tobytes() + b"|")
    return h.hexdigest()[:16]


def _child(name: str, data: str, tokenizer: str, out: str, chat_template: str) -> None:
    """One entry, in this fresh process: prints its seconds, conversations and digest."""
    import datasets
    import numpy as np
    import transformers

    import meshfeed

    datasets.disable_progress_bars()
    hf = transformers.AutoTokenizer.from_pretrained(tokenizer)  # given to every entry
    text = template(chat_template)
    blocks = GENERATION.search(text) is not None
    extra = {"return_assistant_tokens_mask": True} if blocks else {}

    def encode(messages, tools):
        options = {"tools": tools, "chat_template": text, "tokenize": True, "return_dict": True}
        got = hf.apply_chat_template(messages, **options, **extra)
        return {"input_ids": got["input_ids"], "assistant_masks": got.get("assistant_masks")}

    def encode_row(record):
        return encode(record["messages"], record["tools"])

    def encode_batch(batch):
        groups: dict[str, list[int]] = {}  # one call a set of tools
        for i, tools in enumerate(batch["tools"]):
            groups.setdefault(json.dumps(tools), []).append(i)
        ids, masks = [None] * len(batch["tools"]), [None] * len(batch["tools"])
        for tools, rows in groups.items():
            got = encode([batch["messages"][i] for i in rows], json.loads(tools))
            for j, i in enumerate(rows):
                ids[i] = got["input_ids"][j]
                masks[i] = got["assistant_masks"][j] if blocks else None
        return {"input_ids": ids, "assistant_masks": masks}

    start = time.perf_counter()
    read = None
    if name == "meshfeed":
        meshfeed.prepare(
            data,
            out,
            tokenizer=hf,
            chat="messages",
            chat_template=text,
            workers=2,
            progress=False,
        )
        seconds = time.perf_counter() - start
        source = meshfeed.open_source(out)
        got = source[np.arange(len(source))]
        ids = got["tokens"].to_list()
        masks = got["loss_mask"].to_list() if blocks else None
    elif name == "loop":
        with open(data, encoding="utf-8") as f:
            done = [encode(r["messages"], r["tools"]) for r in map(json.loads, f)]
        seconds = time.perf_counter() - start
        ids = [d["input_ids"] for d in done]
        masks = [d["assistant_masks"] for d in done] if blocks else None
    else:
        rows = datasets.Dataset.from_json(data, keep_in_memory=True)
        read = time.perf_counter() - start
        columns = rows.column_names
        if name == "datasets":
            mapped = rows.map(
                encode_batch, batched=True, num_proc=2, keep_in_memory=True, remove_columns=columns
            )
        else:
            mapped = rows.map(encode_row, num_proc=2, remove_columns=columns)
        seconds = time.perf_counter() - start
        ids = mapped["input_ids"]
        masks = mapped["assistant_masks"] if blocks else None
    digest = _digest(ids, masks)
    got = {"seconds": seconds, "read_seconds": read, "conversations": len(ids), "digest": digest}
    print(json.dumps(got))


def _run(name: str, data: Path, tokenizer: Path, scratch: Path, chat_template: str) -> dict:
    """One entry in a fresh process, with a ``datasets`` cache of its own."""
    out = tempfile.mkdtemp(dir=scratch)
    command = [__file__, "--run", name, "--data", str(data), "--tokenizer", str(tokenizer)]
    command += ["--out", str(Path(out) / "out"), "--template", chat_template]
    got = run_child(command, env={**os.environ, "HF_DATASETS_CACHE": out})
    shutil.rmtree(out, ignore_errors=True)
    return got


def _flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--conversations", type=int, default=20_000)
    parser.add_argument(
        "--templates",
        nargs="+",
        default=list(TEMPLATES),
        metavar="NAME",
        help="TRL's chat_templates/NAME.jinja, each on its own",
    )
    parser.add_argument("--entries", nargs="+", default=list(ENTRIES), choices=ENTRIES)
    for flag in ("--template", "--run", "--data", "--tokenizer", "--out"):
        parser.add_argument(flag, default=None, help=argparse.SUPPRESS)


def main() -> None:
    args = arguments(__doc__, rounds=5, smoke={"rounds": 1, "conversations": 100}, add=_flags)
    if args.run:
        _child(args.run, args.data, args.tokenizer, args.out, args.template)
        return
    chosen = ["datasets"] if args.smoke and "--entries" not in sys.argv else args.entries
    entries = tuple(dict.fromkeys(["meshfeed", *chosen]))
    scratch = Path(tempfile.mkdtemp(prefix="meshfeed-chat-bench-"))
    try:
        data, tokenizer = make_data(scratch, args.conversations)
        templates = args.templates[-1:] if args.smoke else args.templates  # the same code
        for chat_template in templates:
            runs = {
                e: functools.partial(_run, e, data, tokenizer, scratch, chat_template)
                for e in entries
            }
            per_round = in_rounds(runs, args.rounds)
            digests = {e: {got[e]["digest"] for got in per_round} for e in entries}
            if len(set().union(*digests.values())) != 1:
                raise RuntimeError(f"{chat_template}: the entries' ids differ: {digests}")
            for got in per_round:
                for one in got.values():
                    one["rate"] = one["conversations"] / one["seconds"]
                    if one["read_seconds"] is not None:
                        one["map_seconds"] = one["seconds"] - one["read_seconds"]
            for name in entries:
                _report(per_round, name, chat_template, args)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _report(per_round: list, name: str, chat_template: str, args: argparse.Namespace) -> None:
    line = {
        "workload": "V",
        "template": chat_template,
        "entry": name,
        "conversations": args.conversations,
        "rounds": args.rounds,
        "conversations_per_s": round(median_of(per_round, name, "rate") or 0.0, 1),
        "meshfeed_over_this": median_ratio(per_round, "meshfeed", name, "rate"),
    }
    if per_round[0][name]["read_seconds"] is not None:  # a ``datasets`` entry: its read apart
        line["read_s"] = round(median_of(per_round, name, "read_seconds") or 0.0, 2)
        mapped = [got[name]["map_seconds"] / got["meshfeed"]["seconds"] for got in per_round]
        line["meshfeed_over_map_alone"] = round(statistics.median(mapped), 3)
    emit("chat", smoke=args.smoke, **line, devices=None, processes=None)


if __name__ == "__main__":
    main()
