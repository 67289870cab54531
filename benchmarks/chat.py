"""Workload V, conversations to tokens and an assistant-only mask: ``prepare(chat=)`` and peers.

The data: generated tool-calling conversations (a system prompt in most, user and
assistant turns, tool calls and their results, unicode), one JSON Lines record each with
the ``tools`` it may call (one to three of a pool, OpenAI's schema), and a byte-level BPE
trained here on such text, wrapped as a ``transformers`` fast tokenizer. The templates
are real ones, as TRL keeps them: Qwen2.5's own (no ``{% generation %}`` blocks, so
meshfeed derives the mask from turn boundaries) and Qwen2.5's training variant (with
them). Every entry is given the loaded tokenizer, in a fresh process, and is timed from
reading the JSON Lines to having every conversation's ids (and, on the template with
blocks, HF's ``assistant_masks``):

- ``datasets``: the peer at its best, ``Dataset.from_json`` then ``Dataset.map`` of a
  batch of ``apply_chat_template`` (``batched=True``, ``num_proc=2``,
  ``keep_in_memory=True``: no Arrow cache written);
- ``datasets-rows``: the same map one record a call (``batched=False``), as the
  ``datasets`` docs' first example writes it;
- ``loop``: ``apply_chat_template`` in a plain loop in one process;
- ``meshfeed``: ``meshfeed.prepare(..., chat="messages", workers=2)``, a folder out, with
  the loss mask on both templates.

Every entry's ids are hashed after its clock stops, and a run whose entries disagree
fails. Rounds rotate the order; the lines give conversations per second and the median
over rounds of meshfeed's ratio to each, taken within each round. Goal: >= 1.5x
``datasets`` on both templates. ``--smoke`` for CI: 100 conversations, one round,
meshfeed and ``datasets``, the last template.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

GENERATION = re.compile(r"\{%-?\s*generation\s*-?%\}")
ENTRIES = ("datasets", "datasets-rows", "loop", "meshfeed")
TEMPLATES = ("qwen2_5", "qwen2_5_training")
WORDS = ["the", "a", "cat", "dog", "sat", "on", "mat", "weather", "today", "is", "sunny",
         "cold", "function", "call", "result", "héllo", "日本語", "😀", "city", "flight",
         "book", "price", "search", "find", "me", "please", "tomorrow", "morning"]  # fmt: skip
TOOLS = ("weather", "flights", "hotels", "stocks", "search", "calendar")


def _tool(name: str) -> dict:
    query = {"type": "string", "description": f"what to look up in {name}"}
    parameters = {"type": "object", "required": ["query"], "properties": {"query": query}}
    function = {"name": name, "description": f"Looks things up in {name}.",
                "parameters": parameters}  # fmt: skip
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
        vocab_size=4000, special_tokens=specials, show_progress=False,
        initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet(),
    )  # fmt: skip
    corpus = [template(TEMPLATES[0]), *(json.dumps(r, ensure_ascii=False) for r in samples)]
    model.train_from_iterator(corpus * 5, trainer)
    hf = transformers.PreTrainedTokenizerFast(
        tokenizer_object=model, unk_token="<unk>", eos_token="<|im_end|>",
        pad_token="<|endoftext|>", additional_special_tokens=["<|im_start|>"],
    )  # fmt: skip
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
        got = hf.apply_chat_template(messages, tools=tools, chat_template=text, tokenize=True,
                                     return_dict=True, **extra)  # fmt: skip
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
        meshfeed.prepare(data, out, tokenizer=hf, chat="messages", chat_template=text,
                         workers=2, progress=False)  # fmt: skip
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
        if name == "datasets":
            mapped = rows.map(encode_batch, batched=True, num_proc=2, keep_in_memory=True,
                              remove_columns=rows.column_names)  # fmt: skip
        else:
            mapped = rows.map(lambda r: encode(r["messages"], r["tools"]), num_proc=2,
                              remove_columns=rows.column_names)  # fmt: skip
        seconds = time.perf_counter() - start
        ids = mapped["input_ids"]
        masks = mapped["assistant_masks"] if blocks else None
    print(json.dumps({"seconds": seconds, "read_seconds": read, "conversations": len(ids),
                      "digest": _digest(ids, masks)}))  # fmt: skip


def _run(name: str, data: Path, tokenizer: Path, scratch: Path, chat_template: str) -> dict:
    out = tempfile.mkdtemp(dir=scratch)
    command = [sys.executable, __file__, "--run", name, "--data", str(data),
               "--tokenizer", str(tokenizer), "--out", str(Path(out) / "out"),
               "--template", chat_template]  # fmt: skip
    env = {**__import__("os").environ, "HF_DATASETS_CACHE": out}
    done = subprocess.run(command, capture_output=True, text=True, check=False, env=env)
    if done.returncode != 0:
        raise RuntimeError(f"{name} failed:\n{done.stderr[-3000:]}")
    shutil.rmtree(out, ignore_errors=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="a few conversations, one round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--conversations", type=int, default=20_000)
    parser.add_argument("--templates", nargs="+", default=list(TEMPLATES), metavar="NAME",
                        help="TRL's chat_templates/NAME.jinja, each on its own")  # fmt: skip
    parser.add_argument("--entries", nargs="+", default=list(ENTRIES), choices=ENTRIES)
    parser.add_argument("--template", help=argparse.SUPPRESS)
    for flag in ("--run", "--data", "--tokenizer", "--out"):
        parser.add_argument(flag, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.run:
        _child(args.run, args.data, args.tokenizer, args.out, args.template)
        return
    rounds, n = (1, 100) if args.smoke else (args.rounds, args.conversations)
    chosen = ["datasets"] if args.smoke and "--entries" not in sys.argv else args.entries
    entries = tuple(dict.fromkeys(["meshfeed", *chosen]))
    scratch = Path(tempfile.mkdtemp(prefix="meshfeed-chat-bench-"))
    try:
        data, tokenizer = make_data(scratch, n)
        templates = args.templates[-1:] if args.smoke else args.templates  # the same code
        for chat_template in templates:
            per_round = []
            for r in range(rounds):
                order = entries[r % len(entries) :] + entries[: r % len(entries)]
                per_round.append(
                    {e: _run(e, data, tokenizer, scratch, chat_template) for e in order}
                )
            digests = {e: {got[e]["digest"] for got in per_round} for e in entries}
            if len(set().union(*digests.values())) != 1:
                raise RuntimeError(f"{chat_template}: the entries' ids differ: {digests}")
            _report(per_round, entries, chat_template, n, rounds, args.smoke)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _report(per_round: list, entries: tuple, chat_template: str, n: int, rounds: int,
            smoke: bool) -> None:  # fmt: skip
    for name in entries:
        rates = [got[name]["conversations"] / got[name]["seconds"] for got in per_round]
        ratio = statistics.median(
            (got["meshfeed"]["conversations"] / got["meshfeed"]["seconds"]) / rate
            for got, rate in zip(per_round, rates, strict=True)
        )
        line = {"benchmark": "chat", "workload": "V", "template": chat_template,
                "entry": name, "conversations": n, "rounds": rounds,
                "conversations_per_s": round(statistics.median(rates), 1),
                "meshfeed_over_this": round(ratio, 3), **_read_part(per_round, name),
                "smoke": smoke,
                "python": sys.version.split()[0]}  # fmt: skip
        print(json.dumps(line), flush=True)


def _read_part(per_round: list, name: str) -> dict:
    """For a ``datasets`` entry: the seconds ``from_json`` took, and meshfeed's ratio to the
    map alone (the peer's time less its read), medians over rounds."""
    if per_round[0][name]["read_seconds"] is None:
        return {}
    mapped = [
        (got[name]["seconds"] - got[name]["read_seconds"]) / got["meshfeed"]["seconds"]
        for got in per_round
    ]
    reads = [got[name]["read_seconds"] for got in per_round]
    return {"read_s": round(statistics.median(reads), 2),
            "meshfeed_over_map_alone": round(statistics.median(mapped), 3)}  # fmt: skip


if __name__ == "__main__":
    main()
