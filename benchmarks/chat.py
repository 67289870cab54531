"""Workload V, conversations to tokens and an assistant-only mask: ``prepare(chat=)`` against
``datasets`` (a batched ``map`` of ``apply_chat_template``), the map a row a call and a loop,
each in a fresh process, every entry's ids equal. Goal: >= 1.5x ``datasets``."""

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

from harness import arguments, emit, in_rounds, median_of, median_ratio
from prepare import byte_bpe

GENERATION = re.compile(r"\{%-?\s*generation\s*-?%\}")
ENTRIES = ("datasets", "datasets-rows", "loop", "meshfeed")
TEMPLATES = ("qwen2_5", "qwen2_5_training")
VOCABULARY = (
    "the a cat dog sat on mat weather today is sunny cold function call result héllo 日本語 😀"
    " city flight book price search find me please tomorrow morning"
)
WORDS = VOCABULARY.split()
TOOLS = ("weather", "flights", "hotels", "stocks", "search", "calendar")
SPECIALS = ["<unk>", "<|im_start|>", "<|im_end|>", "<|endoftext|>"]


def _tool(name: str) -> dict:
    query = {"type": "string", "description": f"what to look up in {name}"}
    parameters = {"type": "object", "required": ["query"], "properties": {"query": query}}
    description = f"Looks things up in {name}."
    function = {"name": name, "description": description, "parameters": parameters}
    return {"type": "function", "function": function}


def template(name: str) -> str:
    import trl

    return (Path(trl.__file__).parent / "chat_templates" / f"{name}.jinja").read_text()


def make_data(folder: Path, n: int) -> tuple[Path, Path]:
    """``n`` conversations as JSON Lines, and a tokenizer folder; their paths."""
    import numpy as np
    import transformers

    rng = np.random.default_rng(0)

    def text(most: int = 40) -> str:
        return " ".join(str(rng.choice(WORDS)) for _ in range(int(rng.integers(1, most))))

    records = []
    for i in range(n):
        tools = [_tool(str(t)) for t in rng.choice(TOOLS, int(rng.integers(1, 4)), False)]
        messages: list[dict] = [{"role": "system", "content": text()}] if rng.random() < 0.8 else []
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
        records.append(json.dumps(record, ensure_ascii=False))
    data = folder / "chats.jsonl"
    data.write_text("".join(r + "\n" for r in records), encoding="utf-8")
    corpus = [template(TEMPLATES[0]), *records[:200]] * 5
    model = byte_bpe(corpus, 4000, SPECIALS, unk_token="<unk>")
    specials: dict = {"unk_token": "<unk>", "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}
    specials["additional_special_tokens"] = ["<|im_start|>"]
    hf = transformers.PreTrainedTokenizerFast(tokenizer_object=model, **specials)
    hf.save_pretrained(folder / "tokenizer")
    return data, folder / "tokenizer"


def run_entry(name: str, data: str, tokenizer: str, cache: str, chat_template: str) -> dict:
    """One entry, in a fresh process with a ``datasets`` cache of its own: its seconds,
    conversations/s, ids' (and masks') digest."""
    os.environ["HF_DATASETS_CACHE"] = cache  # read when datasets is imported
    out = os.path.join(cache, "out")
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
        options = {"tokenizer": hf, "chat": "messages", "chat_template": text, "workers": 2}
        meshfeed.prepare(data, out, **options, progress=False)
        seconds = time.perf_counter() - start
        source = meshfeed.open_source(out)
        got = source[np.arange(len(source))]
        ids = got["tokens"].to_list()
        masks = got["loss_mask"].to_list() if blocks else []
    elif name == "loop":
        with open(data, encoding="utf-8") as f:
            done = [encode(r["messages"], r["tools"]) for r in map(json.loads, f)]
        seconds = time.perf_counter() - start
        ids, masks = [d["input_ids"] for d in done], [d["assistant_masks"] for d in done]
    else:
        rows = datasets.Dataset.from_json(data, keep_in_memory=True)
        read = time.perf_counter() - start
        if name == "datasets":
            options = {"function": encode_batch, "batched": True, "keep_in_memory": True}
        else:  # a record a call
            options = {"function": encode, "input_columns": ["messages", "tools"]}
        mapped = rows.map(num_proc=2, remove_columns=rows.column_names, **options)
        seconds = time.perf_counter() - start
        ids, masks = mapped["input_ids"], mapped["assistant_masks"]
    digest = hashlib.sha256()
    for i, one in enumerate(ids):
        digest.update(np.asarray(one, np.int64).tobytes() + b"|")
        if blocks:
            digest.update(np.asarray(masks[i], bool).tobytes() + b"|")
    got = {"seconds": seconds, "read_seconds": read, "rate": len(ids) / seconds}
    got["map_seconds"] = None if read is None else seconds - read
    return {**got, "digest": digest.hexdigest()[:16]}


def _run(data: Path, tokenizer: Path, scratch: Path, chat_template: str, name: str) -> dict:
    from remote_fns import in_child  # here: the entries' processes import this module, not JAX

    cache = tempfile.mkdtemp(dir=scratch)
    got = in_child(run_entry, name, str(data), str(tokenizer), cache, chat_template)
    shutil.rmtree(cache, ignore_errors=True)
    return got


def _flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--conversations", type=int, default=20_000)
    templates = {"nargs": "+", "default": list(TEMPLATES), "metavar": "NAME"}
    parser.add_argument("--templates", **templates, help="TRL's chat_templates/NAME.jinja, each")
    parser.add_argument("--entries", nargs="+", default=list(ENTRIES), choices=ENTRIES)


def main() -> None:
    args = arguments(__doc__, rounds=5, smoke={"rounds": 1, "conversations": 100}, add=_flags)
    # --smoke: meshfeed and datasets on the last template (the same code)
    chosen = ["datasets"] if args.smoke and "--entries" not in sys.argv else args.entries
    entries = tuple(dict.fromkeys(["meshfeed", *chosen]))
    scratch = Path(tempfile.mkdtemp(prefix="meshfeed-chat-bench-"))
    try:
        data, tokenizer = make_data(scratch, args.conversations)
        for chat_template in args.templates[-1:] if args.smoke else args.templates:
            run = functools.partial(_run, data, tokenizer, scratch, chat_template)
            per_round = in_rounds({e: functools.partial(run, e) for e in entries}, args.rounds)
            digests = {e: {got[e]["digest"] for got in per_round} for e in entries}
            if len(set().union(*digests.values())) != 1:
                raise RuntimeError(f"{chat_template}: the entries' ids differ: {digests}")
            for name in entries:
                line = {"workload": "V", "template": chat_template, "entry": name}
                line |= {"conversations": args.conversations, "rounds": args.rounds}
                line["conversations_per_s"] = round(median_of(per_round, name, "rate") or 0.0, 1)
                line["meshfeed_over_this"] = median_ratio(per_round, "meshfeed", name, "rate")
                if per_round[0][name]["read_seconds"] is not None:  # ``datasets``: read apart
                    line["read_s"] = round(median_of(per_round, name, "read_seconds") or 0.0, 2)
                    mapped = [r[name]["map_seconds"] / r["meshfeed"]["seconds"] for r in per_round]
                    line["meshfeed_over_map_alone"] = round(statistics.median(mapped), 3)
                emit("chat", smoke=args.smoke, **line, devices=None, processes=None)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
