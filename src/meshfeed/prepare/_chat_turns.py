"""A chat template without ``{% generation %}`` blocks: each assistant turn's span from
turn boundaries.

The span of assistant turn ``i`` is what the conversation up to it adds to the turns
before it with the generation prompt: ``[len(before), len(through))`` where ``before``
is ``messages[:i]`` rendered with ``add_generation_prompt=True`` and ``through`` is
``messages[:i + 1]`` rendered without it, both prefixes of the whole conversation's
text. Its tokens are marked by the rule HF's ``assistant_masks`` marks a generation
block's with (``_chat_batch.overlap_mask``: every token whose characters overlap the
span), so a span that starts on a space a token's offsets leave out still marks it.

``encode_conversation`` does it for one conversation through ``apply_chat_template``
(the reference); ``TurnBatch`` for a batch through HF's own renderer, every prefix of
the batch in one call, and one tokenizer call for the batch, checked against the
reference as ``_chat_batch.CheckedBatch`` checks. A template that renders earlier turns
differently once a later one follows has no such boundaries: it is refused before a
build starts (``check_turn_boundaries``), and a conversation on which it shows later
stops the build with the message of the turn it failed at.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from meshfeed.prepare._chat_batch import (
    Batch,
    CheckedBatch,
    Extras,
    alike,
    loop_mask,
    tokenize_marked,
)


class TurnBatch(CheckedBatch):
    """Conversations to ids and turn-boundary masks, a batch at once (module docstring)."""

    def _reference(self, conversations: list[Any], extras: Sequence[Extras]) -> Batch:
        ids, masks = [], []
        for messages, one in zip(conversations, extras, strict=True):
            got, mask = encode_conversation(self._tokenizer, messages, self._template, one)
            ids.append(got)
            masks.append(mask)
        return ids, masks

    def _fast(self, conversations: list[Any], extras: Sequence[Extras]) -> Batch:
        assert self._steps is not None
        normalize = self._steps[0]
        normalized = [normalize(c) for c in conversations]
        texts: list[str] = [""] * len(conversations)
        spans: list[list[tuple[int, int]]] = [[] for _ in conversations]
        slow: set[int] = set()  # conversations the reference encodes (or refuses)
        for same, kwargs in alike(extras):
            turns = [
                (i, t)
                for i in same
                for t, m in enumerate(normalized[i])
                if m.get("role") == "assistant"
            ]
            full = self._render([normalized[i] for i in same], kwargs, prompt=False, spans=False)
            befores = self._render(
                [normalized[i][:t] for i, t in turns], kwargs, prompt=True, spans=False
            )[0]
            ends = [(i, t) for i, t in turns if t + 1 < len(normalized[i])]
            upto_ends = self._render(
                [normalized[i][: t + 1] for i, t in ends], kwargs, prompt=False, spans=False
            )[0]
            through = dict(zip(ends, upto_ends, strict=True))
            for i, text in zip(same, full[0], strict=True):
                texts[i] = text
            for (i, t), before in zip(turns, befores, strict=True):
                upto = through.get((i, t), texts[i])
                if t == 0 or not (texts[i].startswith(upto) and upto.startswith(before)):
                    slow.add(i)
                elif len(upto) > len(before):
                    spans[i].append((len(before), len(upto)))
        ids, masks, backwards = tokenize_marked(self._tokenizer, texts, spans)
        for i in sorted(slow.union(backwards)):
            (ids[i],), (masks[i],) = self._reference([conversations[i]], [extras[i]])
        return ids, masks


def encode_conversation(
    tokenizer: Any,
    messages: Sequence[Mapping[str, Any]],
    template: str,
    extras: Mapping[str, Any] | None = None,
) -> tuple[list[int], np.ndarray]:
    """One conversation's token ids and loss mask, for a template without ``{% generation
    %}`` blocks (the module docstring); ``extras``: its tools, documents and the
    template's keyword arguments."""
    extras = extras or {}
    text = _render(tokenizer, messages, template, extras, prompt=False)
    spans = _assistant_spans(tokenizer, messages, template, extras, text)
    out = tokenizer(text, add_special_tokens=False)
    return list(out["input_ids"]), loop_mask(out.encodings[0].offsets, spans)


def _render(
    tokenizer: Any,
    messages: Sequence[Mapping[str, Any]],
    template: str,
    extras: Mapping[str, Any],
    *,
    prompt: bool,
) -> str:
    return tokenizer.apply_chat_template(
        list(messages),
        chat_template=template,
        tokenize=False,
        add_generation_prompt=prompt,
        **extras,
    )


def _assistant_spans(
    tokenizer: Any,
    messages: Sequence[Mapping[str, Any]],
    template: str,
    extras: Mapping[str, Any],
    text: str,
) -> list[tuple[int, int]]:
    """Each assistant turn's characters in ``text``: what the conversation up to it adds
    to the turns before it with the generation prompt."""
    spans = []
    for i, message in enumerate(messages):
        if message.get("role") != "assistant":
            continue
        before = _render(tokenizer, messages[:i], template, extras, prompt=True)
        through = _render(tokenizer, messages[: i + 1], template, extras, prompt=False)
        if not (text.startswith(through) and through.startswith(before)):
            raise ValueError(
                f"the chat template renders the turns before message {i} (assistant) "
                "differently once it follows, so its span cannot be told from turn "
                f"boundaries; {training_advice(template)}"
            )
        if len(through) > len(before):
            spans.append((len(before), len(through)))
    return spans


PROBES: tuple[list[dict[str, Any]], ...] = (
    [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi."},
        {"role": "assistant", "content": "Hello."},
        {"role": "user", "content": "Bye."},
        {"role": "assistant", "content": "Goodbye."},
    ],
    [
        {"role": "user", "content": "Weather?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "type": "function",
                    "function": {"name": "weather", "arguments": {"city": "Paris"}},
                }
            ],
        },
        {"role": "tool", "content": "Sunny."},
        {"role": "assistant", "content": "Sunny."},
    ],
)
"""Conversations a template without ``{% generation %}`` blocks is tried on before a build
starts: several turns, and a tool call with its result."""


def check_turn_boundaries(tokenizer: Any, template: str, kwargs: Mapping[str, Any]) -> None:
    """Refuses, before any worker starts, a template whose turn boundaries move (one that
    re-renders earlier turns once a later one follows); a probe the template itself
    refuses (roles it does not take) tells nothing and is passed over."""
    for messages in PROBES:
        try:
            text = _render(tokenizer, messages, template, kwargs, prompt=False)
        except Exception:  # the template's own refusal: not this probe's question
            continue
        _assistant_spans(tokenizer, messages, template, kwargs, text)


def training_advice(template: str) -> str:
    """What to pass instead of a template whose turn boundaries move: TRL's training
    variant of the same family, named by its file, where TRL (installed) keeps one."""
    variant = training_variant(template)
    if variant is not None:
        return (
            f"pass chat_template= the training variant TRL keeps for it, {variant} "
            "(its {% generation %} blocks mark the assistant's tokens; TRL trains with it): "
            f"chat_template=open({str(variant)!r}).read(), or --chat-template {variant}."
        )
    return (
        "give a template with {% generation %} blocks (chat_template=): TRL keeps a "
        "training variant for the common families (pip install trl; "
        "trl.chat_template_utils.get_training_chat_template)."
    )


def training_variant(template: str) -> str | None:
    """The path of TRL's training variant of ``template`` (the same text as one of TRL's
    ``chat_templates/<family>.jinja``, with a ``<family>_training.jinja`` beside it), or
    ``None`` where TRL is not installed or keeps none."""
    spec = importlib.util.find_spec("trl")
    if spec is None or not spec.submodule_search_locations:
        return None
    folder = os.path.join(next(iter(spec.submodule_search_locations)), "chat_templates")
    if not os.path.isdir(folder):
        return None
    for name in sorted(os.listdir(folder)):
        family, ext = os.path.splitext(name)
        training = os.path.join(folder, f"{family}_training.jinja")
        if ext != ".jinja" or family.endswith("_training") or not os.path.isfile(training):
            continue
        with open(os.path.join(folder, name), encoding="utf-8") as f:
            if f.read() == template:
                return training
    return None
