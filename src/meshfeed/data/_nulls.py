"""Nulls: values a file leaves out, never read as numbers.

Parquet, Arrow and JSON mark a missing value as null; numpy has no null. A reader that
turns a null integer into ``INT_MIN`` (what ``to_numpy`` then ``astype`` does) or a null
boolean into ``False`` hands the model a value the file does not hold, and says nothing.
So a null in a number or boolean field is read one of two ways:

- ``fill={"age": 0}``: nulls read as the value given, and a ``<field>_valid`` field
  (``bool``, the field's shape; ``Ragged`` for a ragged field) is ``False`` where the
  file held a null -- the mask a loss or a metric multiplies by;
- otherwise it is refused: at open where the file's metadata already counts the nulls
  (Parquet statistics, an Arrow table in memory), else when a read meets one, naming
  the file, the column and the row, as a bad record (``on_error="skip"`` skips it).

Floating-point fields keep NaN for a null, as pandas and ``to_numpy`` do, unless
``fill`` names them. Object fields (strings, bytes, nested values) hold ``None``. A
null list reads as an empty document.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from meshfeed.data._sources import FieldSpec

Fill = Mapping[str, int | float | bool]
"""``{field: value}``: nulls in these number or boolean fields read as ``value``, with a
``<field>_valid`` field that is ``False`` where the file held a null."""
VALID = "_valid"
"""The suffix of a filled field's validity field."""


def valid_name(name: str) -> str:
    """The validity field of the filled field ``name``: ``name + "_valid"``."""
    return name + VALID


def needs_fill(dtype: np.dtype) -> bool:
    """Whether a null of this dtype has no value of its own (integers and booleans do
    not; floats have NaN)."""
    return dtype != np.dtype(object) and dtype.kind in "biu"


def check_fill(
    fill: Fill | None, fields: Mapping[str, FieldSpec], *, what: str
) -> dict[str, np.generic]:
    """``fill`` checked against ``fields``: each value as a scalar of its field's dtype.

    Raises ``TypeError``/``ValueError`` naming the field and the fix (``what`` names
    the data, for messages).
    """
    if fill is None:
        return {}
    if not isinstance(fill, Mapping):
        raise TypeError(f"fill={fill!r} must be a dict of field -> value, e.g. fill={{'age': 0}}.")
    out: dict[str, np.generic] = {}
    for name, value in fill.items():
        if name not in fields:
            raise ValueError(
                f"fill names {name!r}, not a field of {what}; its fields are {list(fields)}."
            )
        dtype = np.dtype(fields[name].dtype)
        if dtype == np.dtype(object):
            raise ValueError(
                f"fill names {name!r}, which holds objects (strings, bytes, nested "
                "values), where a null is None already; fill number and boolean fields."
            )
        if valid_name(name) in fields:
            raise ValueError(
                f"fill names {name!r}, but {what} has a field {valid_name(name)!r} already, "
                "where its validity would go; rename that column or leave it out."
            )
        out[name] = _scalar(name, value, dtype)
    return out


def _scalar(name: str, value: Any, dtype: np.dtype) -> np.generic:
    if isinstance(value, np.generic):
        value = value.item()
    if not isinstance(value, int | float | bool):
        raise TypeError(f"fill[{name!r}]={value!r} must be a number or a bool.")
    with np.errstate(invalid="ignore", over="ignore"):
        cast = np.asarray(value).astype(dtype)
    same = bool(cast == value) or (dtype.kind == "f" and np.isnan(cast) and value != value)
    if not same or (dtype.kind == "b") != isinstance(value, bool):
        raise ValueError(
            f"fill[{name!r}]={value!r} does not fit field {name!r} ({dtype}); pass a value of "
            f"type {dtype}."
        )
    return dtype.type(cast.item())


def with_valid(fields: Mapping[str, FieldSpec], fill: Mapping[str, Any]) -> dict[str, FieldSpec]:
    """``fields`` with a ``bool`` validity field after each filled one (the same shape)."""
    out: dict[str, FieldSpec] = {}
    for name, spec in fields.items():
        out[name] = spec
        if name in fill:
            out[valid_name(name)] = FieldSpec(spec.shape, np.dtype(bool))
    return out


def refused(name: str, dtype: np.dtype, count: int | None, leave_out: str) -> str:
    """Why a field with nulls is refused, and the two ways to read it (``leave_out``:
    the argument that leaves the field out, ``"columns="`` or ``"fields="``)."""
    held = "holds a null" if count is None else f"holds {count:,} null{'s' * (count != 1)}"
    zero = "False" if dtype.kind == "b" else "0"
    return (
        f"field {name!r} ({dtype}) {held}, and no {dtype} value stands for a null; pass "
        f"fill={{{name!r}: {zero}}} to read nulls as {zero}, with a field "
        f"{valid_name(name)!r} that is False where the file holds a null, or leave {name!r} "
        f"out ({leave_out})."
    )
