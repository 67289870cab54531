"""One ``Loader`` option, defined once: a dataclass field that knows its text and its check.

``option(default, doc=, check=)`` is a field of one of ``LoaderOptions``' groups (a
dataclass per group, ``_options``) whose metadata carries what the option means (its
text in ``Loader``'s Args) and its own check; the field's name, type and default are
the rest. From those fields
come the Args of ``Loader``'s docstring (``args_section``), the checks run when the
options are built (``check_each``), and the loader's read-only attributes (``Option``,
one per field, set by ``add_attributes``). The checks of options that only make sense
together (a block and its window, workers and their function, a skip budget and
``on_error``) are their group's.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from typing import Any

Check = Callable[[str, Any], None]
"""Raises, naming the option and the fix, unless the value is one the option takes."""


def option(default: Any = dataclasses.MISSING, *, doc: str, check: Check | None = None) -> Any:
    """A field of an options dataclass: ``default`` (none: required), its text and check."""
    return dataclasses.field(default=default, metadata={"doc": doc, "check": check})


def is_count(value: object) -> bool:
    """An ``int`` proper (``bool`` is an int to Python, never a count here)."""
    return isinstance(value, int) and not isinstance(value, bool)


def count(at_least: int, says: str, *, none: bool = False, auto: bool = False) -> Check:
    """An int ``>= at_least`` (and ``None`` or ``"auto"`` where allowed); else
    ``ValueError("name=value must be <says>.")``."""

    def check(name: str, value: Any) -> None:
        if (none and value is None) or (auto and value == "auto"):
            return
        if not (isinstance(value, int) and not isinstance(value, bool)) or value < at_least:
            raise ValueError(f"{name}={value!r} must be {says}.")

    return check


def known(values: Iterable[object], says: str) -> Check:
    """One of ``values``; else ``ValueError("name=value is unknown; pass <says>.")``."""
    allowed = tuple(values)

    def check(name: str, value: Any) -> None:
        if value not in allowed:
            raise ValueError(f"{name}={value!r} is unknown; pass {says}.")

    return check


def function(says: str) -> Check:
    """A callable or ``None``; else ``TypeError("name=value must be <says>.")``."""

    def check(name: str, value: Any) -> None:
        if value is not None and not callable(value):
            raise TypeError(f"{name}={value!r} must be {says}.")

    return check


def check_each(options: object) -> None:
    """Runs each field's own check on its value, in the order of the fields."""
    for field in dataclasses.fields(options):  # type: ignore[arg-type]
        check = field.metadata.get("check")
        if check is not None:
            check(field.name, getattr(options, field.name))


class Option:
    """A read-only attribute that reads the same-named field of its owner's ``options``."""

    def __init__(self, name: str, doc: str) -> None:
        self._name = name
        self.__doc__ = doc

    def __get__(self, obj: object, owner: type) -> Any:
        if obj is None:
            return self
        return getattr(obj.options, self._name)  # type: ignore[attr-defined]

    def __set__(self, obj: object, value: object) -> None:
        raise AttributeError(
            f"{type(obj).__name__}.{self._name} is read-only: the loader read it once, when "
            f"it was built; build a new Loader with {self._name}={value!r} instead."
        )


def add_attributes(cls: type, options: type) -> None:
    """Gives ``cls`` a read-only attribute per option field it does not define itself
    (``loader.seed`` reads ``loader.options.seed``; ``loader.seed = 5`` raises instead of
    changing nothing)."""
    for field in dataclasses.fields(options):
        if field.init and not hasattr(cls, field.name):  # strategy: the one in use
            doc = f"The ``{field.name}`` option, read-only.\n\n{field.metadata['doc']}"
            setattr(cls, field.name, Option(field.name, doc))


def _wrap(first: str, text: str, then: str) -> list[str]:
    """``first`` and the words of ``text``, in lines of at most 88 columns."""
    lines, line = [], first
    for word in text.split():
        if len(line) + 1 + len(word) > 88:
            lines.append(line)
            line = f"{then}{word}"
        else:
            line += f" {word}" if line.strip() else word
    return [*lines, line]


def args_section(options: type, first: dict[str, str], indent: str = "    ") -> str:
    """The ``Args:`` section of a docstring: ``first`` (name -> text), then each option
    field's text, in order, at ``indent``."""
    texts = dict(first)
    texts.update({f.name: f.metadata["doc"] for f in dataclasses.fields(options) if f.init})
    lines = [f"{indent}Args:"]
    for name, text in texts.items():
        lines += _wrap(f"{indent}  {name}:", text, f"{indent}    ")
    return "\n".join(lines) + "\n"


def groups_line(groups: Iterable[type], indent: str = "    ") -> str:
    """A paragraph naming each group (a dataclass whose docstring says what its options
    govern) and its options, in order, for a docstring."""
    parts = []
    for group in groups:
        what = (group.__doc__ or "").strip().rstrip(".")
        names = [f"``{name}``" for name in group.__annotations__]
        parts.append(f"{what[:1].lower()}{what[1:]} ({', '.join(names)})")
    text = "The options, by group: " + "; ".join(parts) + "."
    return "\n".join(_wrap(indent, text, indent)) + "\n"
