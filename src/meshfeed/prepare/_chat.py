"""Conversations to tokens and an assistant-only loss mask, exactly as Hugging Face makes them.

``prepare(..., chat="messages")`` reads a field holding a conversation as Hugging Face
represents it (a list of ``{"role", "content", ...}`` messages, tool calls included),
with the record's ``tools`` (and RAG ``documents``) where it has them and the build's
template keyword arguments, and writes ``tokens`` and ``loss_mask``, one mask value per
token. Matching Hugging Face is
the specification, so ``transformers`` itself renders and tokenizes (the ``chat``
extra): for every conversation ``tokens`` is ``apply_chat_template(messages, tools=...,
documents=..., tokenize=True, **kwargs)``'s ``input_ids``, nothing added. The mask:

- a template with ``{% generation %}`` blocks: ``assistant_masks`` of
  ``apply_chat_template(..., return_assistant_tokens_mask=True)``, made by Hugging
  Face's own steps on a batch at once, the tokens marked with numpy under its rule, and
  checked against it (``_chat_batch.GenerationBatch``);
- a template without them: each assistant turn's span is derived by rendering turn
  boundaries -- the text the conversation up to that turn renders to, less the text the
  turns before it render to with the generation prompt -- and its tokens marked by the
  rule of HF's ``assistant_masks`` (every token whose characters overlap the span), a
  batch at once (``_chat_turns.TurnBatch``). The span is all the turn adds after the
  generation prompt: its content, its end-of-turn marker and whatever the template puts
  after it. A template that renders earlier turns differently once a later one follows
  (one that drops past reasoning, say) has no such boundaries, and is refused with the
  turn it failed at.

``ChatTokenizer`` is the parent's side (the tokenizer and template checked, their
identity on record, the files a worker rebuilds them from); ``chat_encoder`` is what a
worker runs.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import importlib.util
import json
import os
import pickle
import re
import tempfile
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from meshfeed.data._tokenizer import Tokenizer
from meshfeed.prepare._chat_batch import GenerationBatch
from meshfeed.prepare._chat_turns import TurnBatch, check_turn_boundaries

GENERATION = re.compile(r"\{%-?\s*generation\s*-?%\}")
RESERVED = frozenset(
    {
        "tools",
        "documents",
        "chat_template",
        "tokenize",
        "add_generation_prompt",
        "continue_final_message",
        "return_dict",
        "return_assistant_tokens_mask",
    }
)
"""``apply_chat_template``'s own arguments, which ``chat_template_kwargs`` may not set."""
ChatEncoded = tuple[np.ndarray, list[list[int]], Sequence[Sequence[bool] | np.ndarray]]
"""A batch of conversations encoded: each one's number of tokens, its ids, its mask."""


def require_transformers() -> Any:
    try:
        import transformers
    except ImportError:
        raise ImportError(
            "chat= renders conversations with the model's chat template through "
            "transformers: pip install 'meshfeed[chat]' (from a clone: pip install -e "
            "'.[chat]')."
        ) from None
    return transformers


class ChatTokenizer:
    """A Hugging Face tokenizer and a chat template, checked, with their identity.

    Args:
      tokenizer: a ``transformers`` fast tokenizer, or the folder of one
        (``tokenizer.json`` and ``tokenizer_config.json``).
      template: the chat template (Jinja); ``None``: the tokenizer's own.
      kwargs: the template's keyword arguments (``apply_chat_template``'s
        ``**kwargs``: ``enable_thinking=False``, ...), JSON values.
    """

    kind = "chat"

    def __init__(
        self, tokenizer: Any, template: str | None, kwargs: Mapping[str, Any] | None = None
    ) -> None:
        kwargs = dict(kwargs or {})
        reserved = sorted(set(kwargs) & RESERVED)
        if reserved:
            raise ValueError(
                f"chat_template_kwargs names {reserved}, which prepare sets itself (tools and "
                "documents come from each record: chat_tools=, chat_documents=)."
            )
        try:
            json.dumps(kwargs)
        except (TypeError, ValueError):
            raise TypeError(
                f"chat_template_kwargs={kwargs!r} must be JSON values (they are on record)."
            ) from None
        transformers = require_transformers()
        if isinstance(tokenizer, str | os.PathLike):
            folder = os.fspath(tokenizer)
            if not os.path.isfile(os.path.join(folder, "tokenizer_config.json")):
                raise FileNotFoundError(
                    f"tokenizer={folder!r}: chat= needs a Hugging Face tokenizer folder "
                    "(tokenizer.json and tokenizer_config.json) or a transformers tokenizer."
                )
            tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
        if type(tokenizer).__module__.split(".")[0] != "transformers":
            raise TypeError(
                f"tokenizer is a {type(tokenizer).__name__}; chat= needs a transformers "
                "tokenizer, or the folder of one (tokenizer.json and tokenizer_config.json)."
            )
        if not getattr(tokenizer, "is_fast", False):
            raise ValueError(
                f"{type(tokenizer).__name__} is a slow (Python) tokenizer; chat= needs a fast "
                "one (tokenizer.json), whose offsets map the assistant's text to its tokens."
            )
        template = template if template is not None else tokenizer.chat_template
        if not isinstance(template, str) or not template.strip():
            raise ValueError(
                "the tokenizer has no chat_template; pass chat_template= (the Jinja text)."
            )
        if not GENERATION.search(template):
            check_turn_boundaries(tokenizer, template, kwargs)
        with tempfile.TemporaryDirectory() as folder:
            tokenizer.save_pretrained(folder)
            files = {}
            for name in sorted(os.listdir(folder)):
                with open(os.path.join(folder, name), "rb") as f:
                    files[name] = f.read()
        cls = type(tokenizer)
        self.payload = pickle.dumps(
            {
                "files": files,
                "template": template,
                "kwargs": kwargs,
                "class": (cls.__module__, cls.__qualname__),
            }
        )
        base = Tokenizer(tokenizer.backend_tokenizer, bos=False, eos=False)
        self.vocab_size = base.vocab_size
        self._record = {
            **base.record(),
            "chat_template_sha256": hashlib.sha256(template.encode()).hexdigest(),
            **({"chat_template_kwargs": kwargs} if kwargs else {}),
        }

    def record(self) -> dict[str, Any]:
        """What the build's record holds: the tokenizer's identity and the template's hash."""
        return dict(self._record)


def preload() -> None:
    """Imports what ``chat_encoder`` runs (a worker does it while its parent plans)."""
    with contextlib.suppress(ImportError):
        import transformers.tokenization_utils_tokenizers  # noqa: F401


def chat_encoder(payload: bytes, *, threads: int | None) -> Callable[[list[str]], ChatEncoded]:
    """The encode function of a worker: conversations (JSON text) to ids and masks.

    The tokenizer is rebuilt as the class the caller gave (``AutoTokenizer`` would import
    torch to read a model config first: a second a worker); a batch of conversations
    goes through Hugging Face's steps together (``GenerationBatch``)."""
    if threads is not None:
        os.environ["RAYON_NUM_THREADS"] = str(threads)
    spec = pickle.loads(payload)
    transformers = require_transformers()
    module, name = spec["class"]
    try:  # a class this process cannot import (the caller's script's): AutoTokenizer
        cls = getattr(importlib.import_module(module), name, None)
    except ImportError:
        cls = None
    with tempfile.TemporaryDirectory() as folder:
        for file, data in spec["files"].items():
            with open(os.path.join(folder, file), "wb") as f:
                f.write(data)
        tokenizer = (cls or transformers.AutoTokenizer).from_pretrained(folder)
    template: str = spec["template"]
    kwargs: dict[str, Any] = spec.get("kwargs", {})
    kind = GenerationBatch if GENERATION.search(template) else TurnBatch
    batch = kind(tokenizer, template)

    def encode(texts: list[str]) -> ChatEncoded:
        conversations, extras = [], []
        for text in texts:
            record = json.loads(text)  # the messages, or {"messages", "tools", "documents"}
            messages = record.pop("messages") if isinstance(record, dict) else record
            conversations.append(messages)
            extras.append({**kwargs, **record} if isinstance(record, dict) else kwargs)
        ids, masks = batch(conversations, extras)
        return np.fromiter(map(len, ids), np.int64, count=len(ids)), ids, masks

    return encode
