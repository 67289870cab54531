"""Workload V, conversations to tokens and an assistant-only mask: ``prepare(chat=)`` and peers.

The data: generated conversations (system, user, assistant and tool turns, tool calls,
unicode), one JSON Lines record each, and a byte-level BPE trained here, wrapped as a
``transformers`` fast tokenizer whose ChatML-like template has ``{% generation %}``
blocks. Every entry makes each conversation's ``input_ids`` and ``assistant_masks`` as
``apply_chat_template(..., return_assistant_tokens_mask=True)`` does, each in a fresh
process, timed from reading the JSON Lines to having every conversation's tokens:

- ``loop``: the template and tokenizer called in a plain loop in one process;
- ``datasets``: ``Dataset.from_json`` and ``Dataset.map`` of that call, ``num_proc=2``;
- ``meshfeed``: ``meshfeed.prepare(..., chat="messages", workers=2)``, a folder out.

Rounds rotate the order; the lines give conversations per second and the median over
rounds of meshfeed's ratio to each, taken within each round. Goal: >= 1.5x ``datasets``.
``--smoke`` for CI.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ENTRIES = ("loop", "datasets", "meshfeed")
WORDS = ["the", "a", "cat", "dog", "sat", "on", "mat", "weather", "today", "is", "sunny",
         "cold", "function", "call", "result", "héllo", "日本語", "😀"]  # fmt: skip
TEMPLATE = (
    "{%- for message in messages %}{{- '<|im_start|>' + message['role'] + '\\n' }}"
    "{%- if message['role'] == 'assistant' %}{%- generation %}"
    "{%- if message['content'] %}{{- message['content'] }}{%- endif %}"
    "{%- if message.tool_calls is defined and message.tool_calls %}"
    "{{- '<tool_call>' + (message.tool_calls | tojson) + '</tool_call>' }}{%- endif %}"
    "{{- '<|im_end|>\\n' }}{%- endgeneration %}"
    "{%- else %}{{- message['content'] + '<|im_end|>\\n' }}{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def make_data(folder: Path, n: int) -> tuple[Path, Path]:
    """``n`` conversations as JSON Lines, and a tokenizer folder; their paths."""
    import numpy as np
    import tokenizers
    import transformers

    rng = np.random.default_rng(0)

    def text() -> str:
        return " ".join(str(rng.choice(WORDS)) for _ in range(int(rng.integers(1, 40))))

    data = folder / "chats.jsonl"
    with open(data, "w", encoding="utf-8") as f:
        for i in range(n):
            messages = [{"role": "system", "content": text()}]
            for _ in range(int(rng.integers(1, 4))):
                messages.append({"role": "user", "content": text()})
                if rng.random() < 0.2:
                    function = {"name": "weather", "arguments": {"city": text()}}
                    call = {"type": "function", "function": function}
                    messages.append({"role": "assistant", "content": "", "tool_calls": [call]})
                    messages.append({"role": "tool", "content": text()})
                messages.append({"role": "assistant", "content": text()})
            f.write(json.dumps({"id": i, "messages": messages}, ensure_ascii=False) + "\n")
    model = tokenizers.Tokenizer(tokenizers.models.BPE(unk_token="<unk>"))
    model.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    model.decoder = tokenizers.decoders.ByteLevel()
    trainer = tokenizers.trainers.BpeTrainer(
        vocab_size=1000, special_tokens=["<unk>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet(), show_progress=False,
    )  # fmt: skip
    model.train_from_iterator([" ".join([*WORDS, "user assistant system tool"])] * 50, trainer)
    hf = transformers.PreTrainedTokenizerFast(
        tokenizer_object=model, unk_token="<unk>", eos_token="<|im_end|>",
        additional_special_tokens=["<|im_start|>"],
    )  # fmt: skip
    hf.chat_template = TEMPLATE
    hf.save_pretrained(folder / "tokenizer")
    return data, folder / "tokenizer"


def _child(name: str, data: str, tokenizer: str, out: str) -> None:
    """One entry, in this fresh process: prints its seconds and conversations."""
    import transformers

    start = time.perf_counter()
    if name == "meshfeed":
        import meshfeed

        status = meshfeed.prepare(data, out, tokenizer=tokenizer, chat="messages", workers=2,
                                  progress=False)  # fmt: skip
        count = status.documents
    else:
        hf = transformers.AutoTokenizer.from_pretrained(tokenizer)

        def encode(messages):
            got = hf.apply_chat_template(messages, tokenize=True, return_dict=True,
                                         return_assistant_tokens_mask=True)  # fmt: skip
            return {"input_ids": got["input_ids"], "assistant_masks": got["assistant_masks"]}

        if name == "loop":
            with open(data, encoding="utf-8") as f:
                done = [encode(json.loads(line)["messages"]) for line in f]
            count = len(done)
        else:
            import datasets

            datasets.disable_progress_bars()
            rows = datasets.Dataset.from_json(data, cache_dir=out)
            mapped = rows.map(lambda r: encode(r["messages"]), num_proc=2,
                              remove_columns=rows.column_names)  # fmt: skip
            count = len(mapped)
    print(json.dumps({"seconds": time.perf_counter() - start, "conversations": count}))


def _run(name: str, data: Path, tokenizer: Path, scratch: Path) -> dict:
    out = tempfile.mkdtemp(dir=scratch)
    command = [sys.executable, __file__, "--run", name, "--data", str(data),
               "--tokenizer", str(tokenizer), "--out", str(Path(out) / "out")]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{name} failed:\n{done.stderr[-3000:]}")
    shutil.rmtree(out, ignore_errors=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="a few conversations, one round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--conversations", type=int, default=20_000)
    for flag in ("--run", "--data", "--tokenizer", "--out"):
        parser.add_argument(flag, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.run:
        _child(args.run, args.data, args.tokenizer, args.out)
        return
    rounds, n = (1, 300) if args.smoke else (args.rounds, args.conversations)
    scratch = Path(tempfile.mkdtemp(prefix="meshfeed-chat-bench-"))
    try:
        data, tokenizer = make_data(scratch, n)
        per_round = []
        for r in range(rounds):
            order = ENTRIES[r % len(ENTRIES) :] + ENTRIES[: r % len(ENTRIES)]
            per_round.append({name: _run(name, data, tokenizer, scratch) for name in order})
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    for name in ENTRIES:
        rates = [got[name]["conversations"] / got[name]["seconds"] for got in per_round]
        ratio = statistics.median(
            (got["meshfeed"]["conversations"] / got["meshfeed"]["seconds"]) / rate
            for got, rate in zip(per_round, rates, strict=True)
        )
        line = {"benchmark": "chat", "workload": "V", "entry": name, "conversations": n,
                "rounds": rounds, "conversations_per_s": round(statistics.median(rates), 1),
                "meshfeed_over_this": round(ratio, 3), "smoke": args.smoke,
                "python": sys.version.split()[0]}  # fmt: skip
        print(json.dumps(line), flush=True)


if __name__ == "__main__":
    main()
