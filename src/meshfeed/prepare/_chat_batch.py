"""A batch of conversations to ids and assistant masks: Hugging Face's own steps, the mask at once.

``apply_chat_template(..., return_assistant_tokens_mask=True)`` in transformers 5 does
four things: it normalizes the messages (``_normalize_chat_messages``), renders them
(``render_jinja_template``, which also gives each ``{% generation %}`` block's span of
characters), tokenizes the text with the tokenizer's backend, and then marks, in a
Python loop over every token, the tokens whose characters overlap a span. That loop,
with the token offsets it reads and the ``BatchEncoding`` around the ids, is ~15% of the
call's time; marking the tokens with numpy still reads the offsets, so a part of a
build takes ~5% less (median of 8 rounds, ``benchmarks/chat.py``'s conversations).

``GenerationBatch`` calls the same functions of ``transformers`` for the first three
steps, and marks the tokens under the same rule with numpy: token ``t`` with characters
``[s, e)`` is marked when the first span ending after ``s`` starts before ``e``. That is
the loop's rule wherever token starts and span ends do not go backwards (the loop makes
one pass over both); a conversation where they do goes through ``apply_chat_template``.

A record's ``tools`` and ``documents`` and the build's template keyword arguments
(``enable_thinking``, ...) reach the template as ``apply_chat_template`` passes them:
conversations with the same ones are rendered together, and all are tokenized at once.

Exactness is checked, not assumed:

- the batched steps are used only where ``transformers`` is version 5 (whose rule this
  is) and its two functions import; elsewhere every batch is ``apply_chat_template``'s;
- the first conversation of every batch is also encoded by ``apply_chat_template``. A
  difference sends that batch and every later one through ``apply_chat_template``, and
  says so once on stderr. (The tests compare every conversation of theirs.)
"""

from __future__ import annotations

import itertools
import json
import sys
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

Batch = tuple[list[list[int]], list[np.ndarray]]
Extras = Mapping[str, Any]
"""What a conversation is rendered with besides its messages: its ``tools`` and
``documents``, and the template's keyword arguments (``apply_chat_template``'s)."""


class CheckedBatch:
    """Conversations to ids and masks by batched steps, checked against a reference that
    encodes one conversation at a time: the first conversation of every batch is encoded
    both ways, and a difference sends this batch and every later one through the
    reference, said once on stderr. Subclasses give ``_reference`` and ``_fast``."""

    def __init__(self, tokenizer: Any, template: str) -> None:
        self._tokenizer = tokenizer
        self._template = template
        self._steps = _steps()
        # What apply_chat_template works out on every call, once: the template it renders
        # (a name resolved to its text) and the special tokens it passes to it.
        self._resolved = tokenizer.get_chat_template(template, None)
        self._specials = dict(tokenizer.special_tokens_map)

    def __call__(self, conversations: list[Any], extras: Sequence[Extras]) -> Batch:
        if self._steps is None:
            return self._reference(conversations, extras)
        # First: it also sets the backend as its call does.
        reference = self._reference(conversations[:1], extras[:1])
        ids, masks = self._fast(conversations, extras)
        if _same(reference, (ids[:1], masks[:1])):
            return ids, masks
        self._steps = None
        print(
            "meshfeed: the batched chat-template steps differ from apply_chat_template in "
            "this version of transformers; this worker uses apply_chat_template alone.",
            file=sys.stderr,
            flush=True,
        )
        return self._reference(conversations, extras)

    def _reference(self, conversations: list[Any], extras: Sequence[Extras]) -> Batch:
        raise NotImplementedError

    def _fast(self, conversations: list[Any], extras: Sequence[Extras]) -> Batch:
        raise NotImplementedError

    def _render(
        self, conversations: list[Any], extras: Extras, *, prompt: bool, spans: bool
    ) -> tuple[list[str], list[Any]]:
        """HF's renderer on normalized conversations, as ``apply_chat_template`` calls it."""
        assert self._steps is not None
        rest = dict(extras)
        tools = rest.pop("tools", None)
        documents = rest.pop("documents", None)
        return self._steps[1](
            conversations=conversations,
            tools=tools,
            documents=documents,
            chat_template=self._resolved,
            return_assistant_tokens_mask=spans,
            continue_final_message=False,
            add_generation_prompt=prompt,
            **{**self._specials, **rest},
        )


class GenerationBatch(CheckedBatch):
    """Conversations to ``input_ids`` and ``assistant_masks`` as ``apply_chat_template``
    makes them, for a template with ``{% generation %}`` blocks (the module docstring)."""

    def _reference(self, conversations: list[Any], extras: Sequence[Extras]) -> Batch:
        ids: list[list[int]] = [[] for _ in conversations]
        masks: list[np.ndarray] = [np.zeros(0, bool) for _ in conversations]
        for same, kwargs in alike(extras):
            out = self._tokenizer.apply_chat_template(
                [conversations[i] for i in same],
                chat_template=self._template,
                tokenize=True,
                return_dict=True,
                return_assistant_tokens_mask=True,
                **kwargs,
            )
            for i, one, mask in zip(same, out["input_ids"], out["assistant_masks"], strict=True):
                ids[i] = list(one)
                masks[i] = np.asarray(mask, dtype=bool)
        return ids, masks

    def _fast(self, conversations: list[Any], extras: Sequence[Extras]) -> Batch:
        assert self._steps is not None
        normalize = self._steps[0]
        texts: list[str] = [""] * len(conversations)
        spans: list[Any] = [None] * len(conversations)
        for same, kwargs in alike(extras):
            rendered, marked = self._render(
                [normalize(conversations[i]) for i in same], kwargs, prompt=False, spans=True
            )
            for i, text, span in zip(same, rendered, marked, strict=True):
                texts[i], spans[i] = text, span
        ids, masks, backwards = tokenize_marked(self._tokenizer, texts, spans)
        for i in backwards:  # the loop's one pass misreads these
            masks[i] = self._reference([conversations[i]], [extras[i]])[1][0]
        return ids, masks


def tokenize_marked(
    tokenizer: Any, texts: list[str], spans: Sequence[Sequence[tuple[int, int]]]
) -> tuple[list[list[int]], list[np.ndarray], list[int]]:
    """``texts`` tokenized at once by the tokenizer's backend, each one's tokens marked
    where they overlap its ``spans`` (``overlap_mask``); and the conversations whose
    token starts or span ends go backwards, whose masks the caller makes."""
    encodings = tokenizer.backend_tokenizer.encode_batch(texts, add_special_tokens=False)
    ids = [e.ids for e in encodings]
    lengths = np.fromiter(map(len, ids), np.int64, count=len(ids))
    offsets = np.fromiter(
        itertools.chain.from_iterable(itertools.chain.from_iterable(e.offsets for e in encodings)),
        np.int64,
        count=2 * int(lengths.sum()),
    ).reshape(-1, 2)
    mask, backwards = overlap_mask(offsets, lengths, spans)
    masks = np.split(mask, np.cumsum(lengths)[:-1])
    return ids, masks, np.flatnonzero(backwards).tolist()


def loop_mask(offsets: Sequence[tuple[int, int]], spans: Sequence[tuple[int, int]]) -> np.ndarray:
    """One conversation's tokens marked by transformers 5's own loop (one pass over the
    tokens and the spans), which ``overlap_mask`` agrees with where nothing goes
    backwards."""
    mask = np.zeros(len(offsets), dtype=bool)
    span = 0
    for token, (start, end) in enumerate(offsets):
        while span < len(spans) and start >= spans[span][1]:
            span += 1
        if span == len(spans):
            break
        mask[token] = end > spans[span][0]
    return mask


def alike(extras: Sequence[Extras]) -> list[tuple[list[int], Extras]]:
    """The conversations rendered with the same extras, by index, each group once.
    Extras are alike when they print alike: key order counts, since templates print
    tools with ``tojson``, which keeps it."""
    groups: dict[str, tuple[list[int], Extras]] = {}
    for i, one in enumerate(extras):
        key = json.dumps(one, default=repr)
        groups.setdefault(key, ([], one))[0].append(i)
    return list(groups.values())


def overlap_mask(
    offsets: np.ndarray, lengths: np.ndarray, spans: Sequence[Sequence[tuple[int, int]]]
) -> tuple[np.ndarray, np.ndarray]:
    """The tokens of a batch of conversations (``offsets``: each token's ``[start, end)``
    characters, ``lengths`` tokens a conversation) marked as transformers 5 marks them
    against each conversation's ``spans``; and which conversations it cannot tell (token
    starts or span ends going backwards)."""
    n = len(lengths)
    owner = np.repeat(np.arange(n), lengths)  # each token's conversation
    counts = np.fromiter(map(len, spans), np.int64, count=n)
    span = np.asarray([s for one in spans for s in one], dtype=np.int64).reshape(-1, 2)
    span_owner = np.repeat(np.arange(n), counts)
    starts, ends = offsets[:, 0], offsets[:, 1]
    backwards = np.zeros(n, dtype=bool)
    back = np.flatnonzero(np.diff(starts) < 0)
    backwards[owner[back + 1][owner[back] == owner[back + 1]]] = True
    back = np.flatnonzero(np.diff(span[:, 1]) < 0)
    backwards[span_owner[back + 1][span_owner[back] == span_owner[back + 1]]] = True
    # The first span of the token's own conversation that ends after the token starts:
    # keys order (conversation, character), so one search serves the whole batch.
    scale = int(max(starts.max(initial=0), span.max(initial=0))) + 1
    first = np.searchsorted(span_owner * scale + span[:, 1], owner * scale + starts, "right")
    mask = np.zeros(len(starts), dtype=bool)
    inside = first < len(span)
    inside[inside] = span_owner[first[inside]] == owner[inside]
    mask[inside] = ends[inside] > span[first[inside], 0]
    return mask, backwards


def _steps() -> tuple[Any, Any] | None:
    """``transformers``' normalizer and renderer, where its mask rule is version 5's."""
    import transformers

    if int(transformers.__version__.split(".")[0]) != 5:
        return None
    try:
        from transformers.utils.chat_template_utils import (
            _normalize_chat_messages,
            render_jinja_template,
        )
    except ImportError:
        return None
    return _normalize_chat_messages, render_jinja_template


def _same(a: Batch, b: Batch) -> bool:
    return len(a[0]) == len(b[0]) and all(
        list(x) == list(y) and np.array_equal(m, n)
        for x, y, m, n in zip(a[0], b[0], a[1], b[1], strict=True)
    )
