"""Tokenizers, identified by what they do: content hash, fingerprint, special tokens.

A folder of tokens is only as good as the record of what made it. Levanter and Marin
record a tokenizer's *name* and only warn on a mismatch; a backend change that dropped
a BOS token then cost them terabytes rebuilt. meshfeed records what the tokenizer *is*:

- the SHA-256 of its serialised form (``tokenizers.Tokenizer.to_str()``, with the
  truncation and padding settings left out, since meshfeed turns both off), which a
  changed normaliser, pre-tokeniser, merge or added token changes;
- a *fingerprint*: the ids of a fixed list of probe strings (accents composed and
  decomposed, ligatures, full-width letters, code, numbers, whitespace runs, emoji),
  encoded without special tokens, which a behaviour change shows even where the bytes
  of the serialised form cannot be compared (a tokenizer given as a function);
- the vocabulary size, the BOS and EOS ids and the policy that added them.

``Tokenizer`` wraps what the user gives -- a ``tokenizers.Tokenizer``, the path of a
``tokenizer.json``, or a ``TokenizerFunction`` -- into one encoder that workers rebuild
from a payload (the JSON, or the function pickled by value). BOS and EOS are never left
to the tokenizer's post-processor: documents are encoded without special tokens and
the ids are added explicitly, so the record says exactly what was added.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import pickle
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np

PROBES = (
    "Hello, world!",
    "naïve café résumé",  # precomposed accents
    "nai\u0308ve cafe\u0301",  # the same, decomposed
    "ﬁnance ﬂow",  # ligatures
    "\uff26\uff35\uff2c\uff2c width",  # full-width letters
    "def f(x):\n    return x ** 2  # code\n",
    "3.14159 2,718 1e-9 0x1F",
    "   leading and trailing spaces   ",
    "tabs\tand\nnewlines\r\n",
    "UPPER lower MiXeD",
    "emoji 🙂🚀 and CJK 漢字",
    "<|endoftext|> <s> </s> [CLS]",
)
"""Strings whose ids make a tokenizer's fingerprint (encoded without special tokens)."""
_EOS_NAMES = ("</s>", "<|endoftext|>", "<eos>", "[EOS]", "<|end_of_text|>", "<|eot_id|>")
_BOS_NAMES = ("<s>", "<bos>", "[BOS]", "<|begin_of_text|>", "<|startoftext|>")


@dataclasses.dataclass(frozen=True)
class TokenizerFunction:
    """A tokenizer given as a function, with the identity meshfeed records for it.

    Args:
      encode: ``encode(texts: list[str]) -> list[list[int]]``, without special tokens.
        It travels to worker processes by value (cloudpickle).
      name: what it is (``"my-bpe"``); recorded, and compared when a folder is opened.
      version: which version of it; recorded and compared like ``name``.
      vocab_size: ids are below this; it sets the tokens' dtype (the narrowest unsigned).
      bos_id: the id added before every document with ``bos=True``, if any.
      eos_id: the id added after every document with ``eos=True`` (the default).
    """

    encode: Callable[[list[str]], list[list[int]]]
    name: str
    version: str
    vocab_size: int
    bos_id: int | None = None
    eos_id: int | None = None

    def __post_init__(self) -> None:
        if not callable(self.encode):
            raise TypeError(f"encode is a {type(self.encode).__name__}; pass a function.")
        for field in ("name", "version"):
            if not isinstance(getattr(self, field), str) or not getattr(self, field):
                raise ValueError(f"{field}={getattr(self, field)!r} must be a non-empty string.")
        if not isinstance(self.vocab_size, int) or self.vocab_size < 1:
            raise ValueError(f"vocab_size={self.vocab_size!r} must be an int >= 1.")


TokenizerArg = Any
"""A ``tokenizers.Tokenizer``, the path of a ``tokenizer.json``, or a ``TokenizerFunction``."""
Special = bool | str | int
"""A BOS or EOS policy: ``True`` (the tokenizer's own), ``False`` (none), a token or an id."""


def token_dtype(vocab_size: int) -> np.dtype:
    """The narrowest unsigned dtype that holds ids below ``vocab_size``."""
    for dtype in (np.uint8, np.uint16, np.uint32):
        if vocab_size <= np.iinfo(dtype).max + 1:
            return np.dtype(dtype)
    return np.dtype(np.uint64)


class Tokenizer:
    """What the user gave, as one encoder with its identity (the module docstring)."""

    def __init__(self, tokenizer: TokenizerArg, *, bos: Special = True, eos: Special = True):
        if isinstance(tokenizer, str | os.PathLike):
            self._from_file(os.fspath(tokenizer))
        elif isinstance(tokenizer, TokenizerFunction):
            self.kind = "function"
            self.payload = _pickled(tokenizer)
            self.name = f"{tokenizer.name}@{tokenizer.version}"
            self.vocab_size = tokenizer.vocab_size
            self.sha256 = None
            self._own = (tokenizer.bos_id, tokenizer.eos_id)
            self._encode = encoder("function", self.payload, threads=None)
        elif type(tokenizer).__module__.split(".")[0] == "tokenizers":
            self._from_json(tokenizer.to_str(), name="tokenizers.Tokenizer")
        else:
            raise TypeError(
                f"tokenizer is a {type(tokenizer).__name__}; pass a tokenizers.Tokenizer, "
                "the path of a tokenizer.json, or meshfeed.types.TokenizerFunction(encode, "
                "name=..., version=..., vocab_size=...)."
            )
        self.bos_id = self._special("bos", bos, self._own[0], required=False)
        self.eos_id = self._special("eos", eos, self._own[1], required=True)
        self.policy = {"bos": _policy(bos), "eos": _policy(eos)}

    def _from_file(self, path: str) -> None:
        if not os.path.isfile(path):
            raise FileNotFoundError(
                f"tokenizer={path!r} is not a file; pass the path of a tokenizer.json, a "
                "tokenizers.Tokenizer or a meshfeed.types.TokenizerFunction."
            )
        with open(path, encoding="utf-8") as f:
            self._from_json(f.read(), name=os.path.basename(path))

    def _from_json(self, text: str, *, name: str) -> None:
        tokenizers = require_tokenizers()
        try:
            model = tokenizers.Tokenizer.from_str(text)
        except Exception as error:
            raise ValueError(f"{name} is not a tokenizers JSON file: {error}") from None
        config = json.loads(text)
        config["truncation"] = config["padding"] = None  # meshfeed turns both off
        canonical = json.dumps(config, sort_keys=True, ensure_ascii=False)
        self.kind = "tokenizers"
        self.payload = text.encode()
        self.name = name
        self.sha256 = hashlib.sha256(canonical.encode()).hexdigest()
        self.vocab_size = model.get_vocab_size(with_added_tokens=True)
        self._model = model
        self._own = _template_specials(config, model)
        self._encode = encoder(self.kind, self.payload, threads=None)

    def _special(
        self, which: str, value: Special, own: int | None, *, required: bool
    ) -> int | None:
        if value is False or value is None:
            return None
        if value is True:
            if own is None and required:
                raise ValueError(
                    f"the tokenizer defines no {which.upper()} token, and {which}=True adds "
                    f"one after every document; pass {which}='<token>' or {which}=<id> to "
                    f"name it, or {which}=False to add none."
                )
            return own
        if isinstance(value, int) and not isinstance(value, bool):
            if not 0 <= value < self.vocab_size:
                raise ValueError(
                    f"{which}={value} is not an id of the vocabulary (0..{self.vocab_size - 1})."
                )
            return value
        if isinstance(value, str):
            found = self._model.token_to_id(value) if self.kind == "tokenizers" else None
            if found is None:
                raise ValueError(
                    f"{which}={value!r} is not a token of the tokenizer; pass a token it "
                    f"has, an id, or {which}=False."
                )
            return int(found)
        raise TypeError(f"{which}={value!r} must be True, False, a token string or an id.")

    def encode(self, texts: list[str]) -> list[list[int]]:
        """The ids of each text, without special tokens."""
        return [list(ids) for ids in self._encode(texts)[1]]

    def record(self) -> dict[str, Any]:
        """What the manifest records (and ``open_source(tokenizer=...)`` compares)."""
        return {
            "kind": self.kind,
            "name": self.name,
            "sha256": self.sha256,
            "vocab_size": self.vocab_size,
            "bos_id": self.bos_id,
            "eos_id": self.eos_id,
            "policy": self.policy,
            "fingerprint": [list(map(int, ids)) for ids in self.encode(list(PROBES))],
            "versions": _versions(self.kind),
        }


def differences(recorded: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """What differs between two tokenizer records, each named, in words."""
    out = []
    for key, what in (
        ("kind", "kind"),
        ("name", "name"),
        ("sha256", "content hash (SHA-256 of its serialised form)"),
        ("vocab_size", "vocabulary size"),
        ("bos_id", "BOS id"),
        ("eos_id", "EOS id"),
        ("policy", "BOS/EOS policy"),
        ("chat_template_sha256", "chat template (SHA-256)"),
    ):
        if key == "name" and recorded.get("kind") == "tokenizers":
            continue  # a file's name says nothing; its hash does
        old, new = recorded.get(key), current.get(key)
        if old != new:
            if key in ("sha256", "chat_template_sha256"):
                old, new = (f"{v[:12]}..." if isinstance(v, str) else v for v in (old, new))
            out.append(f"{what}: {old!r} in the folder, {new!r} here")
    pairs = zip(PROBES, recorded["fingerprint"], current["fingerprint"], strict=False)
    for probe, old, new in pairs:
        if old != new:
            out.append(
                f"fingerprint: {probe!r} encodes to {_short(new)} here, {_short(old)} in the folder"
            )
            break
    return out


Encoded = tuple[np.ndarray, Iterable[Iterable[int]]]
"""A batch encoded: each text's number of ids, and the ids (read once, in order)."""


def encoder(kind: str, payload: bytes, *, threads: int | None) -> Callable[[list[str]], Encoded]:
    """The encode function a worker rebuilds from a ``Tokenizer``'s payload.

    It returns each text's length and its ids as iterables, so that the ids go from the
    tokenizer's objects into one numpy array without a list of lists in between.
    ``threads`` caps the Rust thread pool of ``tokenizers`` (``RAYON_NUM_THREADS``); it
    takes effect only before the library's first parallel call in the process, so
    workers set it first thing.
    """
    if kind == "function":
        function: TokenizerFunction = pickle.loads(payload)

        def encode_lists(texts: list[str]) -> Encoded:
            ids = function.encode(texts)
            if len(ids) != len(texts):
                raise ValueError(
                    f"{function.name} returned {len(ids)} encodings for {len(texts)} texts; "
                    "encode must return one list of ids per text."
                )
            return np.fromiter(map(len, ids), np.int64, count=len(ids)), ids

        return encode_lists
    if threads is not None:
        os.environ["RAYON_NUM_THREADS"] = str(threads)
        os.environ["TOKENIZERS_PARALLELISM"] = "true"
    model = require_tokenizers().Tokenizer.from_str(payload.decode())
    model.no_truncation()
    model.no_padding()

    def encode(texts: list[str]) -> Encoded:
        encodings = model.encode_batch_fast(texts, add_special_tokens=False)
        lengths = np.fromiter(map(len, encodings), np.int64, count=len(encodings))
        return lengths, (e.ids for e in encodings)

    return encode


def require_tokenizers() -> Any:
    try:
        import tokenizers
    except ImportError:
        raise ImportError(
            "a tokenizer.json needs Hugging Face tokenizers: pip install 'meshfeed[text]' "
            "(from a clone: pip install -e '.[text]')."
        ) from None
    return tokenizers


def _template_specials(config: dict[str, Any], model: Any) -> tuple[int | None, int | None]:
    """(BOS, EOS) ids the tokenizer defines: its post-processor's template, else by name."""
    bos = eos = None
    for processor in _processors(config.get("post_processor")):
        kind = processor.get("type")
        if kind == "TemplateProcessing":
            single: Sequence[dict[str, Any]] = processor.get("single", [])
            at = next((i for i, p in enumerate(single) if "Sequence" in p), None)
            if at is not None:
                before = [p["SpecialToken"]["id"] for p in single[:at] if "SpecialToken" in p]
                after = [p["SpecialToken"]["id"] for p in single[at + 1 :] if "SpecialToken" in p]
                bos = model.token_to_id(before[-1]) if before else bos
                eos = model.token_to_id(after[0]) if after else eos
        elif kind in ("BertProcessing", "RobertaProcessing"):
            bos, eos = processor["cls"][1], processor["sep"][1]
    specials = {t["content"]: t["id"] for t in config.get("added_tokens", []) if t.get("special")}
    if eos is None:
        eos = next((specials[n] for n in _EOS_NAMES if n in specials), None)
    if bos is None:
        bos = next((specials[n] for n in _BOS_NAMES if n in specials), None)
    return bos, eos


def _processors(processor: dict[str, Any] | None) -> list[dict[str, Any]]:
    if not processor:
        return []
    if processor.get("type") == "Sequence":
        return [p for inner in processor.get("processors", []) for p in _processors(inner)]
    return [processor]


def _policy(value: Special) -> Any:
    return value if isinstance(value, bool | str | int) else bool(value)


def _pickled(function: TokenizerFunction) -> bytes:
    import cloudpickle

    return cloudpickle.dumps(function)


def _versions(kind: str) -> dict[str, str]:
    from importlib.metadata import version

    out = {"meshfeed": version("meshfeed")}
    if kind == "tokenizers":
        out["tokenizers"] = version("tokenizers")
    return out


def _short(ids: list[int]) -> str:
    return str(ids) if len(ids) <= 8 else f"[{', '.join(map(str, ids[:8]))}, ...] ({len(ids)} ids)"
