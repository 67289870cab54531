"""Conversations to tokens and an assistant-only loss mask, checked against Hugging Face.

The tokenizer is built here: a ``tokenizers`` BPE trained on a small text, wrapped as a
``transformers`` fast tokenizer, with two ChatML-like templates that render the same
text -- one with ``{% generation %}`` blocks, one without -- and 500 generated
conversations (system, user, assistant and tool turns, several turns, unicode and
emoji, empty content, tool calls). HF's ``apply_chat_template`` is the oracle.
"""

from __future__ import annotations

import json
import subprocess
import sys

import jax
import numpy as np
import pytest

import meshfeed
from prepare_fns import chat_tokenizer, tree

transformers = pytest.importorskip("transformers", reason="the chat extra (transformers)")
tokenizers = pytest.importorskip("tokenizers", reason="the text extra (tokenizers)")

ASSISTANT = (
    "{%- generation %}"
    "{%- if message['content'] %}{{- message['content'] }}{%- endif %}"
    "{%- if message.tool_calls is defined and message.tool_calls %}"
    "{{- '<tool_call>' + (message.tool_calls | tojson) + '</tool_call>' }}{%- endif %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- endgeneration %}"
)
GENERATION = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' }}"
    "{%- if message['role'] == 'assistant' %}" + ASSISTANT + "{%- else %}"
    "{{- message['content'] + '<|im_end|>\\n' }}"
    "{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
PLAIN = GENERATION.replace("{%- generation %}", "").replace("{%- endgeneration %}", "")
WORDS = [
    "the",
    "a",
    "cat",
    "dog",
    "sat",
    "ran",
    "on",
    "mat",
    "weather",
    "today",
    "is",
    "sunny",
    "cold",
    "function",
    "call",
    "result",
]
EXTRA = ["héllo", "naïve", "日本語", "😀", "🚀 go", "Ωmega", ""]


def _conversations(n: int, seed: int = 0) -> list[list[dict]]:
    rng = np.random.default_rng(seed)

    def text() -> str:
        words = [str(rng.choice(WORDS)) for _ in range(int(rng.integers(0, 12)))]
        if rng.random() < 0.3:
            words.insert(int(rng.integers(0, len(words) + 1)), str(rng.choice(EXTRA)))
        return " ".join(words)

    out = []
    for _ in range(n):
        messages: list[dict] = []
        if rng.random() < 0.5:
            messages.append({"role": "system", "content": text()})
        for _ in range(int(rng.integers(1, 4))):
            messages.append({"role": "user", "content": text()})
            if rng.random() < 0.25:  # a tool call, its result, then the answer
                call = {"type": "function",
                        "function": {"name": "weather", "arguments": {"city": text()}}}  # fmt: skip
                messages.append({"role": "assistant", "content": "", "tool_calls": [call]})
                messages.append({"role": "tool", "content": text()})
            messages.append({"role": "assistant", "content": text()})
        out.append(messages)
    return out


@pytest.fixture(scope="module")
def chat(tmp_path_factory):
    """A tokenizer folder (the generation template its own), and conversations as JSONL."""
    root = tmp_path_factory.mktemp("chat")
    text = " ".join(WORDS + EXTRA + ["user assistant system tool weather city"])
    hf = chat_tokenizer(
        root / "tokenizer", text, ["<unk>", "<|im_start|>", "<|im_end|>"], vocab_size=400,
        unk_token="<unk>", eos_token="<|im_end|>", additional_special_tokens=["<|im_start|>"],
    )  # fmt: skip
    hf.chat_template = GENERATION
    hf.save_pretrained(root / "tokenizer")
    conversations = _conversations(500)
    with open(root / "chats.jsonl", "w", encoding="utf-8") as f:
        for i, messages in enumerate(conversations):
            f.write(json.dumps({"id": i, "messages": messages}, ensure_ascii=False) + "\n")
    return {"root": root, "tokenizer": root / "tokenizer", "hf": hf,
            "jsonl": root / "chats.jsonl", "conversations": conversations}  # fmt: skip


def _read(folder) -> tuple[list[list[int]], list[list[bool]]]:
    source = meshfeed.open_source(folder)
    got = source[np.arange(len(source))]
    return ([t.tolist() for t in got["tokens"].to_list()],
            [m.tolist() for m in got["loss_mask"].to_list()])  # fmt: skip


def _oracle(hf, messages, template=GENERATION):
    out = hf.apply_chat_template(
        messages, chat_template=template, tokenize=True, return_dict=True,
        return_assistant_tokens_mask=True,
    )  # fmt: skip
    return list(out["input_ids"]), [bool(m) for m in out["assistant_masks"]]


@pytest.mark.parametrize("template", ["generation", "plain"])
def test_tokens_and_masks_equal_hugging_faces_for_every_conversation(chat, tmp_path, template):
    """Tokens: ``apply_chat_template(tokenize=True)`` with the template used. Masks: HF's
    ``assistant_masks`` of the template with generation blocks (the plain one renders
    the same text, its spans derived from turn boundaries)."""
    text = None if template == "generation" else PLAIN
    status = meshfeed.prepare(
        chat["jsonl"], tmp_path / "out", tokenizer=chat["tokenizer"], chat="messages",
        chat_template=text, workers=1, progress=False,
    )  # fmt: skip
    assert status.complete and status.documents == 500
    tokens, masks = _read(tmp_path / "out")
    hf = chat["hf"]
    for i, messages in enumerate(chat["conversations"]):
        want_tokens, want_mask = _oracle(hf, messages)
        if text is not None:
            assert hf.apply_chat_template(messages, chat_template=PLAIN, tokenize=True,
                                          return_dict=True)["input_ids"] == want_tokens  # fmt: skip
        assert tokens[i] == want_tokens, (i, messages)
        assert masks[i] == want_mask, (i, messages)
    assert sum(map(sum, masks)) > 0 and sum(map(len, masks)) > sum(map(sum, masks))


def test_the_same_bytes_for_1_or_3_workers_and_part_runs(chat, tmp_path):
    kw = {"tokenizer": chat["tokenizer"], "chat": "messages", "part_bytes": 20_000}
    meshfeed.prepare(chat["jsonl"], tmp_path / "w1", workers=1, progress=False, **kw)
    reference = tree(tmp_path / "w1")
    assert len([k for k in reference if k.endswith("meshfeed.json")]) > 3
    for workers in (3,):  # uneven shares (2 workers: test_prepare)
        meshfeed.prepare(chat["jsonl"], tmp_path / f"w{workers}", workers=workers,
                         progress=False, **kw)  # fmt: skip
        assert tree(tmp_path / f"w{workers}") == reference
    command = [
        sys.executable, "-m", "meshfeed", "prepare", str(chat["jsonl"]), "--tokenizer",
        str(chat["tokenizer"]), "--chat", "messages", "--out", str(tmp_path / "parts"),
        "--part-bytes", "20000", "--workers", "1", "--quiet",
    ]  # fmt: skip
    for share in ("1/2", "0/2"):
        run = subprocess.run([*command, "--part", share], capture_output=True, text=True)
        assert run.returncode == 0, run.stderr[-2000:]
    assert tree(tmp_path / "parts") == reference


def test_parquet_and_a_datasets_dataset_give_hugging_faces_tokens(chat, tmp_path):
    """Conversations in a Parquet file and in a ``datasets.Dataset``: Arrow gives every
    message every key of any message (``None`` where it had none), and the tokens and
    masks are HF's for the rows as read."""
    pq = pytest.importorskip("pyarrow.parquet", reason="the parquet extra (pyarrow)")
    datasets = pytest.importorskip("datasets", reason="the hf extra (datasets)")
    rows = [{"id": i, "messages": m} for i, m in enumerate(chat["conversations"][:120])]
    import pyarrow as pa

    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "chats.parquet", row_group_size=50)
    read = pq.read_table(tmp_path / "chats.parquet").to_pylist()
    kw = {"tokenizer": chat["tokenizer"], "chat": "messages", "workers": 1, "progress": False}
    meshfeed.prepare(tmp_path / "chats.parquet", tmp_path / "from-parquet", **kw)
    dataset = datasets.Dataset.from_parquet(str(tmp_path / "chats.parquet"),
                                            cache_dir=str(tmp_path / "cache"))  # fmt: skip
    meshfeed.prepare(dataset, tmp_path / "from-dataset", **kw)
    for folder in ("from-parquet", "from-dataset"):
        tokens, masks = _read(tmp_path / folder)
        assert len(tokens) == 120
        for i, row in enumerate(read):
            assert (tokens[i], masks[i]) == _oracle(chat["hf"], row["messages"]), (folder, i)


def test_another_template_is_refused_by_name_and_bad_conversations_are_named(chat, tmp_path):
    kw = {"tokenizer": chat["tokenizer"], "chat": "messages", "workers": 1, "progress": False}
    meshfeed.prepare(chat["jsonl"], tmp_path / "out", **kw)
    with pytest.raises(ValueError, match="chat template"):
        meshfeed.prepare(chat["jsonl"], tmp_path / "out", chat_template=PLAIN + " ", **kw)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"messages": [{"role": "user", "content": "hi"}]}\n{"messages": "hi"}\n')
    with pytest.raises(ValueError, match=r"bad.jsonl, line 2: field 'messages' holds 'hi'"):
        meshfeed.prepare(bad, tmp_path / "bad", **kw)
    with pytest.raises(ValueError, match="chat_template= is for conversations"):
        meshfeed.prepare(bad, tmp_path / "x", tokenizer=chat["tokenizer"], chat_template=PLAIN)
    with pytest.raises(FileNotFoundError, match="Hugging Face tokenizer folder"):
        meshfeed.prepare(bad, tmp_path / "x", tokenizer=tmp_path, chat="messages")


def _whole(chat) -> dict[tuple[int, ...], list[bool]]:
    """Each conversation's tokens -> its mask, as HF makes them."""
    return {tuple(t): m for t, m in map(lambda c: _oracle(chat["hf"], c), chat["conversations"])}


def _segments(rows: dict[str, np.ndarray]):
    """Every (tokens, mask) segment of packed rows, and the mask on padding."""
    for tokens, mask, segments in zip(
        rows["tokens"], rows["loss_mask"], rows["segment_ids"], strict=True
    ):
        assert not mask[segments == 0].any()  # nothing to learn on padding
        for s in np.unique(segments[segments > 0]):
            at = segments == s
            yield tuple(tokens[at].tolist()), mask[at].tolist()


def test_packed_and_padded_rows_keep_each_conversations_mask(chat, tmp_path):
    """Packed: every segment is a whole conversation (none longer than the row), its mask
    HF's, so no mask crosses a segment. Padded (one conversation a row): the same."""
    meshfeed.prepare(chat["jsonl"], tmp_path / "out", tokenizer=chat["tokenizer"],
                     chat="messages", workers=1, progress=False)  # fmt: skip
    source = meshfeed.open_source(tmp_path / "out")
    whole = _whole(chat)
    longest = max(map(len, whole))
    for packed in (
        meshfeed.pack(source, 2 * longest, long_docs="error"),
        meshfeed.pack(source, longest, long_docs="error", max_segments=1),  # padded
    ):
        rows = packed[np.arange(len(packed))]
        seen = 0
        for tokens, mask in _segments(rows):
            assert whole[tokens] == mask
            seen += 1
        assert seen == 500
    short = meshfeed.pack(source, 32, long_docs="truncate", max_segments=1)
    rows = short[np.arange(len(short))]
    for tokens, mask in _segments(rows):  # each row the start of its conversation
        first = next(t for t in whole if t[: len(tokens)] == tokens)
        assert whole[first][: len(tokens)] == mask


def test_a_loader_over_packed_conversations_restores_on_another_device_count(chat, tmp_path):
    meshfeed.prepare(chat["jsonl"], tmp_path / "out", tokenizer=chat["tokenizer"],
                     chat="messages", workers=1, progress=False)  # fmt: skip
    packed = meshfeed.pack(meshfeed.open_source(tmp_path / "out"), 128)

    def loader(devices: int) -> meshfeed.Loader:
        mesh = meshfeed.make_mesh(data=devices, devices=jax.devices()[:devices])
        return meshfeed.Loader(packed, global_batch_size=8, shuffle=True, seed=3,
                               sharding=meshfeed.batch_sharding(mesh))  # fmt: skip

    on_eight = loader(8)
    it = iter(on_eight)
    for _ in range(3):
        next(it)
    state = on_eight.state()
    want = [{k: np.asarray(v) for k, v in next(it).items()} for _ in range(4)]
    on_four = loader(4)
    on_four.restore(state)
    got = iter(on_four)
    for batch in want:
        for name, value in next(got).items():
            np.testing.assert_array_equal(np.asarray(value), batch[name])
    assert want[0]["loss_mask"].any() and set(want[0]) >= {"tokens", "loss_mask", "segment_ids"}


def _hf_loop(offsets, spans) -> list[bool]:
    """transformers 5's loop that marks a conversation's tokens (``apply_chat_template``,
    ``return_assistant_tokens_mask=True``), as it is written there."""
    mask, span = [False] * len(offsets), 0
    for token, (start, end) in enumerate(offsets):
        while span < len(spans) and start >= spans[span][1]:
            span += 1
        if span == len(spans):
            break
        if end > spans[span][0]:
            mask[token] = True
    return mask


def test_the_batched_mask_marks_what_hugging_faces_loop_marks():
    """Random tokens (zero-width ones and ones across a span's edge included) and spans,
    many conversations in one call; a conversation whose token starts go backwards is
    handed back, not guessed."""
    from meshfeed.prepare._chat_batch import overlap_mask

    rng = np.random.default_rng(0)
    for _ in range(200):
        n = int(rng.integers(1, 8))
        offsets, spans, lengths = [], [], []
        for _ in range(n):
            widths = rng.integers(0, 4, int(rng.integers(0, 30)))
            ends = np.cumsum(widths)
            one = np.stack([ends - widths, ends], axis=1) if len(widths) else np.zeros((0, 2))
            edges = np.sort(rng.choice(int(ends[-1]) + 2 if len(widths) else 2, 6))
            kept = [(int(a), int(b)) for a, b in edges.reshape(-1, 2) if b > a]
            offsets.append(one.astype(np.int64))
            spans.append(kept[: int(rng.integers(0, len(kept) + 1))])
            lengths.append(len(one))
        backwards = int(rng.integers(0, n)) if rng.random() < 0.3 else None
        if backwards is not None and lengths[backwards] > 2:
            offsets[backwards][[0, -1], 0] = offsets[backwards][[-1, 0], 0]
        mask, flagged = overlap_mask(
            np.concatenate(offsets).reshape(-1, 2), np.array(lengths), spans
        )
        parts = np.split(mask, np.cumsum(lengths)[:-1])
        for i in range(n):
            goes_back = bool((np.diff(offsets[i][:, 0]) < 0).any())
            assert flagged[i] == goes_back
            if not goes_back:
                assert parts[i].tolist() == _hf_loop(offsets[i].tolist(), spans[i]), i


@pytest.mark.parametrize("template", ["generation", "plain"])
def test_a_batch_that_differs_from_its_reference_falls_back_to_it(
    chat, monkeypatch, capsys, template
):
    """The batched steps agree with their reference on every conversation
    (``apply_chat_template`` for generation blocks; turn boundaries rendered one
    conversation at a time for the plain template); where they would not (a renderer
    that doubles every newline, standing for another transformers), the batch's first
    conversation shows it and the rest go through the reference."""
    from meshfeed.prepare import _chat_batch as batched
    from meshfeed.prepare import _chat_turns as turns

    hf, conversations = chat["hf"], chat["conversations"]
    want = [_oracle(hf, messages) for messages in conversations]
    kind, text = (
        (batched.GenerationBatch, GENERATION) if template == "generation"
        else (turns.TurnBatch, PLAIN)
    )  # fmt: skip

    def got(batch) -> list[tuple[list[int], list[bool]]]:
        out = []
        for k in range(0, len(conversations), 64):
            chunk = conversations[k : k + 64]
            ids, masks = batch(chunk, [{}] * len(chunk))
            out += [(list(i), np.asarray(m).tolist()) for i, m in zip(ids, masks, strict=True)]
        return out

    assert got(kind(hf, text)) == want
    steps = batched._steps()
    if steps is None:
        pytest.skip("transformers 4: every batch goes through apply_chat_template itself")
    normalize, render = steps

    def moved(**kwargs):
        texts, spans = render(**kwargs)
        return [t.replace("\n", "\n\n") for t in texts], spans

    monkeypatch.setattr(batched, "_steps", lambda: (normalize, moved))
    assert got(kind(hf, text)) == want
    assert capsys.readouterr().err.count("uses apply_chat_template alone") == 1


def test_a_conversation_whose_turn_boundaries_move_stops_the_build_naming_its_turn(chat, tmp_path):
    """A template that passes the probes but re-renders an earlier turn of one
    conversation once a later one follows (a user's "secret" hidden unless it is last):
    the build stops with that turn named, nothing guessed."""
    hides = PLAIN.replace(
        "{{- message['content'] + '<|im_end|>\\n' }}",
        "{{- ('hidden' if message['content'] == 'secret' and not loop.last "
        "else message['content']) + '<|im_end|>\\n' }}",
    )
    assert hides != PLAIN
    rows = tmp_path / "rows.jsonl"
    with open(rows, "w") as f:
        for messages in chat["conversations"][:50]:
            f.write(json.dumps({"messages": messages}) + "\n")
        secret = [{"role": "user", "content": "secret"}, {"role": "assistant", "content": "ok"}]
        f.write(json.dumps({"messages": secret}) + "\n")
    with pytest.raises(Exception, match=r"renders the turns before message 1 \(assistant\)"):
        meshfeed.prepare(rows, tmp_path / "out", tokenizer=chat["tokenizer"], chat="messages",
                         chat_template=hides, workers=1, progress=False)  # fmt: skip


TOOLS = (  # the tools in the system turn and a template option, as Qwen-style templates do
    "{%- if tools %}{{- '<|im_start|>system\\n# Tools\\n' }}"
    "{%- for tool in tools %}{{- tool | tojson }}{{- '\\n' }}{%- endfor %}"
    "{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- if enable_thinking is defined and not enable_thinking %}{{- '<think></think>\\n' }}"
    "{%- endif %}"
)


def _tool(name: str) -> dict:
    return {"type": "function", "function": {
        "name": name, "description": f"the {name} of a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                       "required": ["city"]}}}  # fmt: skip


@pytest.mark.parametrize("blocks", [True, False], ids=["generation", "plain"])
def test_a_records_tools_and_the_template_kwargs_reach_the_template_as_hf_passes_them(
    chat, tmp_path, blocks
):
    """Records with and without tools (of their own), rendered by a template that puts
    them in the system turn and reads ``enable_thinking``: tokens and masks are
    ``apply_chat_template(messages, tools=record's, enable_thinking=False)``'s, through a
    worker process, on both the batched and the turn-boundary paths; the tools change
    the tokens exactly as they change HF's."""
    template = TOOLS + (GENERATION if blocks else PLAIN)
    weather = _tool("weather")
    function = weather["function"]  # the same schema, its keys in another order:
    reordered = {"function": {k: function[k] for k in reversed(function)}, "type": "function"}
    sets = [None, [weather], [weather, _tool("time")], [reordered]]
    records = [
        {"messages": m, "tools": sets[i % 4]} for i, m in enumerate(chat["conversations"][:90])
    ]
    with open(tmp_path / "tools.jsonl", "w", encoding="utf-8") as f:
        f.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in records)
    meshfeed.prepare(
        tmp_path / "tools.jsonl", tmp_path / "out", tokenizer=chat["tokenizer"],
        chat="messages", chat_template=template, workers=1, progress=False,
        chat_template_kwargs={"enable_thinking": False},
    )  # fmt: skip
    tokens, masks = _read(tmp_path / "out")
    hf = chat["hf"]

    def oracle(messages, **kwargs):  # the generation variant: its masks are HF's own
        out = hf.apply_chat_template(
            messages, chat_template=TOOLS + GENERATION, tokenize=True, return_dict=True,
            return_assistant_tokens_mask=True, enable_thinking=False, **kwargs,
        )  # fmt: skip
        return list(out["input_ids"]), [bool(m) for m in out["assistant_masks"]]

    for i, record in enumerate(records):
        want = oracle(record["messages"], tools=record["tools"])
        assert (tokens[i], masks[i]) == want, i
        without = oracle(record["messages"])[0]  # the same record, no tools
        assert (want[0] != without) == (record["tools"] is not None), i
        if record["tools"] is sets[1]:  # equal to sets[3] as dicts; printed in its key order
            assert want[0] != oracle(record["messages"], tools=[reordered])[0], i
    record = json.loads((tmp_path / "out" / "meshfeed.prepare.json").read_text())
    assert "enable_thinking" in json.dumps(record)
    if blocks:  # the same build from the command line's flags
        (tmp_path / "template.jinja").write_text(template)
        command = [
            sys.executable, "-m", "meshfeed", "prepare", str(tmp_path / "tools.jsonl"),
            "--tokenizer", str(chat["tokenizer"]), "--chat", "messages", "--chat-template",
            str(tmp_path / "template.jinja"), "--chat-template-kwargs",
            '{"enable_thinking": false}', "--out", str(tmp_path / "cli"), "--workers", "1",
            "--quiet",
        ]  # fmt: skip
        run = subprocess.run(command, capture_output=True, text=True)
        assert run.returncode == 0, run.stderr[-2000:]
        assert tree(tmp_path / "cli") == tree(tmp_path / "out")


def test_chat_options_without_chat_and_bad_tools_are_named(chat, tmp_path):
    with pytest.raises(ValueError, match="chat_template_kwargs= is for conversations"):
        meshfeed.prepare(chat["jsonl"], tmp_path / "a", tokenizer=chat["tokenizer"],
                         chat_template_kwargs={"enable_thinking": False})  # fmt: skip
    with pytest.raises(ValueError, match=r"names \['tools'\], which prepare sets itself"):
        meshfeed.prepare(chat["jsonl"], tmp_path / "b", tokenizer=chat["tokenizer"],
                         chat="messages", chat_template_kwargs={"tools": []},
                         workers=1, progress=False)  # fmt: skip
    with open(tmp_path / "bad.jsonl", "w") as f:
        f.write(json.dumps({"messages": chat["conversations"][0], "tools": "weather"}) + "\n")
    with pytest.raises(ValueError, match=r"field 'tools' holds 'weather', not a list of tools"):
        meshfeed.prepare(tmp_path / "bad.jsonl", tmp_path / "c", tokenizer=chat["tokenizer"],
                         chat="messages", workers=1, progress=False)  # fmt: skip


def _openai(messages: list[dict]) -> list[dict]:
    """The same conversation as OpenAI's format writes it: arguments as JSON strings,
    content as a list of text parts (split in two where it has a space)."""
    out = []
    for m in messages:
        m = dict(m)
        text = m.get("content") or ""
        cut = text.find(" ") + 1 or len(text)
        m["content"] = [{"type": "text", "text": text[:cut]}, {"type": "text", "text": text[cut:]}]
        if m.get("tool_calls"):
            m["tool_calls"] = [{**c, "function": {**c["function"], "arguments": json.dumps(
                c["function"]["arguments"])}} for c in m["tool_calls"]]  # fmt: skip
        out.append(m)
    return out


def test_openai_format_records_are_read_as_given_or_normalized_by_name(chat, tmp_path):
    """As given (the default), a tool call's JSON-string arguments reach the template as
    a string, as with ``apply_chat_template`` (this template's ``tojson`` encodes them
    twice); ``chat_openai=True`` parses them and joins text parts, giving the tokens of
    the conversation written the way chat templates expect."""
    conversations = [c for c in chat["conversations"] if any("tool_calls" in m for m in c)][:40]
    hf = chat["hf"]
    strings = [[{**m, "tool_calls": _openai([m])[0]["tool_calls"]} if m.get("tool_calls")
                else m for m in c] for c in conversations]  # fmt: skip
    with open(tmp_path / "strings.jsonl", "w", encoding="utf-8") as f:
        f.writelines(json.dumps({"messages": c}, ensure_ascii=False) + "\n" for c in strings)
    kw = {"tokenizer": chat["tokenizer"], "chat": "messages", "workers": 1, "progress": False}
    meshfeed.prepare(tmp_path / "strings.jsonl", tmp_path / "given", **kw)
    tokens, masks = _read(tmp_path / "given")
    for i, messages in enumerate(strings):  # as given: HF's tokens for the strings
        assert (tokens[i], masks[i]) == _oracle(hf, messages), i
        assert tokens[i] != _oracle(hf, conversations[i])[0], i  # encoded twice
    with open(tmp_path / "openai.jsonl", "w", encoding="utf-8") as f:
        f.writelines(
            json.dumps({"messages": _openai(c)}, ensure_ascii=False) + "\n" for c in conversations
        )
    meshfeed.prepare(tmp_path / "openai.jsonl", tmp_path / "read", chat_openai=True, **kw)
    tokens, masks = _read(tmp_path / "read")
    for i, messages in enumerate(conversations):  # normalized: the dict-argument tokens
        assert (tokens[i], masks[i]) == _oracle(hf, messages), i
