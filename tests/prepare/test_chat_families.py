"""The chat templates of real model families, as TRL ships them, against Hugging Face.

Each family's original template (``trl/chat_templates/<family>.jinja``) renders 500
generated conversations -- system prompts, several turns, tool calls and their
results, a record's tools, empty content -- shaped as the family takes them (Gemma 3:
user and assistant turns only; DeepSeek-V3: tool-call arguments as JSON text). What is
checked, through a worker process:

- a template whose turn boundaries hold (Llama 3.1, Qwen2.5, Gemma 3): the tokens are
  ``apply_chat_template``'s, and the masks, from turn boundaries, are HF's
  ``assistant_masks`` of TRL's training variant where it renders the same tokens, but
  for whitespace at a turn's edges (TRL's blocks may take in the newline after the role
  header, which the rule counts as the generation prompt's);
- a template that re-renders earlier turns once a later one follows (Qwen3, Phi-3.5,
  DeepSeek-V3, gpt-oss) is refused before the build starts, naming TRL's training
  variant, and with that variant the tokens and masks are HF's.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from test_chat import _conversations, _read, _tool

import meshfeed
from prepare_fns import chat_tokenizer

transformers = pytest.importorskip("transformers", reason="the chat extra (transformers)")
tokenizers = pytest.importorskip("tokenizers", reason="the text extra (tokenizers)")
trl = pytest.importorskip("trl", reason="the trl extra: TRL ships the families' templates")
TEMPLATES = Path(trl.__file__).parent / "chat_templates"
KEPT = ["llama3_1", "qwen2_5", "gemma3"]
REFUSED = ["qwen3", "phi3_5", "deepseekv3", "gptoss"]
N = 500


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    root = tmp_path_factory.mktemp("families")
    text = "the cat sat on a mat weather today is sunny user assistant system tool city"
    hf = chat_tokenizer(root / "tokenizer", text, ["<unk>", "<s>", "</s>"], vocab_size=500,
                        unk_token="<unk>", bos_token="<s>", eos_token="</s>")  # fmt: skip
    return hf, root


def _records(family: str) -> list[dict]:
    """500 records as ``family`` takes them: messages, and tools on every other one."""
    records = []
    for i, messages in enumerate(_conversations(N, seed=7)):
        if family == "gemma3":  # user and assistant turns only, a system prompt first
            messages = [m for m in messages if m["role"] in ("system", "user", "assistant")
                        and not m.get("tool_calls")]  # fmt: skip
        if family == "deepseekv3":  # its template joins the arguments as text
            messages = [
                {**m, "tool_calls": [{**c, "function": {**c["function"], "arguments":
                    json.dumps(c["function"]["arguments"])}} for c in m["tool_calls"]]}
                if m.get("tool_calls") else m for m in messages
            ]  # fmt: skip
        record = {"messages": messages}
        if i % 2 and family != "gemma3":
            record["tools"] = [_tool("weather")] + ([_tool("time")] if i % 4 == 1 else [])
        records.append(record)
    return records


def _hf(hf, template: str, record: dict, masks: bool) -> tuple[list[int], list[bool] | None]:
    out = hf.apply_chat_template(
        record["messages"], tools=record.get("tools"), chat_template=template, tokenize=True,
        return_dict=True, return_assistant_tokens_mask=masks,
    )  # fmt: skip
    return list(out["input_ids"]), [bool(m) for m in out["assistant_masks"]] if masks else None


def _build(tokenizer, family: str, template: str, tmp_path: Path) -> tuple[list, list]:
    _, root = tokenizer
    tmp_path.mkdir(parents=True, exist_ok=True)
    path = tmp_path / f"{family}.jsonl"
    with open(path, "w", encoding="utf-8") as f:
        f.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in _records(family))
    meshfeed.prepare(path, tmp_path / family, tokenizer=root / "tokenizer", chat="messages",
                     chat_template=template, workers=1, progress=False)  # fmt: skip
    return _read(tmp_path / family)


@pytest.mark.parametrize("family", KEPT)
def test_a_family_whose_turn_boundaries_hold_gets_hugging_faces_tokens(tokenizer, family, tmp_path):
    hf, _ = tokenizer
    original = (TEMPLATES / f"{family}.jinja").read_text()
    variant = TEMPLATES / f"{family}_training.jinja"
    tokens, masks = _build(tokenizer, family, original, tmp_path)
    for i, record in enumerate(_records(family)):
        want, _ = _hf(hf, original, record, masks=False)
        assert tokens[i] == want, (family, i)
        if variant.exists():  # TRL's variant renders the same tokens, with HF's masks
            same, hf_mask = _hf(hf, variant.read_text(), record, masks=True)
            assert same == want, (family, i)
            # The turn-boundary rule marks what a turn adds after the generation prompt;
            # TRL's blocks may start or end a newline apart: they differ in whitespace only.
            apart = np.flatnonzero(np.asarray(masks[i]) != np.asarray(hf_mask))
            assert all(not hf.decode([want[k]]).strip() for k in apart), (family, i)
    marked = np.concatenate([np.asarray(m, bool) for m in masks])
    assert 0 < marked.sum() < marked.size


@pytest.mark.parametrize("family", REFUSED)
def test_a_family_that_rerenders_past_turns_is_refused_naming_trls_variant(
    tokenizer, family, tmp_path
):
    hf, _ = tokenizer
    original = (TEMPLATES / f"{family}.jinja").read_text()
    variant = TEMPLATES / f"{family}_training.jinja"
    with pytest.raises(ValueError, match=rf"TRL keeps for it, .*{family}_training\.jinja"):
        _build(tokenizer, family, original, tmp_path / "refused")
    tokens, masks = _build(tokenizer, family, variant.read_text(), tmp_path)
    for i, record in enumerate(_records(family)):
        assert (tokens[i], masks[i]) == _hf(hf, variant.read_text(), record, masks=True), i
