"""``tf.train.Example`` read without TensorFlow: ``parse_example``, and its features' types.

``parse_example`` reads a serialised ``tf.train.Example`` -- a protocol buffer of named
bytes, float and int64 lists -- straight from the wire format, so TFDS and older Google
data need no TensorFlow to load. A record the wire format cannot hold raises (the
reader names the file and the record: ``_tfrecord``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from meshfeed.data._sources import FieldSpec

OBJECT = np.dtype(object)
FeatureType = str
"""A feature's type with ``decode="example"``: ``"int64"``, ``"float32"``, ``"bytes"`` (one
value each), or ``"ragged:int64"``, ``"ragged:float32"``, ``"bytes_list"`` (any number)."""


def _varint(data: bytes, at: int) -> tuple[int, int]:
    value = shift = 0
    while shift < 70:  # 10 bytes at most, as protobuf's parser allows
        if at >= len(data):
            raise ValueError("a protocol buffer varint runs past the end of its message")
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, at
        shift += 7
    raise ValueError("a protocol buffer varint longer than 10 bytes")


_SIZES = {5: 4, 1: 8}  # fixed32, fixed64


def _fields(data: bytes) -> list[tuple[int, int, Any]]:
    """(field number, wire type, value) of each field of one message; a message the wire
    format cannot hold raises, as protobuf's own parser refuses it."""
    out, at = [], 0
    while at < len(data):
        key, at = _varint(data, at)
        number, wire = key >> 3, key & 7
        if number == 0:
            raise ValueError("a protocol buffer field numbered 0, which no message has")
        if wire == 0:
            value, at = _varint(data, at)
        elif wire in (1, 2, 5):
            length, at = _varint(data, at) if wire == 2 else (_SIZES[wire], at)
            if at + length > len(data):
                raise ValueError(
                    f"a protocol buffer field of {length} bytes runs past the end of its message"
                )
            value, at = data[at : at + length], at + length
        else:
            raise ValueError(
                f"a protocol buffer field of wire type {wire}, which Example does not use"
            )
        out.append((number, wire, value))
    return out


def parse_example(data: bytes) -> dict[str, Any]:
    """A serialised ``tf.train.Example``: feature name -> a list of bytes, or a float32 or
    int64 array, as its ``bytes_list``, ``float_list`` or ``int64_list`` holds it."""
    out: dict[str, Any] = {}
    for number, _, features in _fields(data):
        if number != 1:
            continue
        for entry_number, _, entry in _fields(features):
            if entry_number != 1:
                continue
            key, feature = "", b""
            for n, _, v in _fields(entry):
                if n == 1:
                    key = v.decode()
                elif n == 2:
                    feature = v
            out[key] = _feature(feature)
    return out


def _feature(feature: bytes) -> Any:
    for kind, _, body in _fields(feature):
        values = _fields(body)
        if kind == 1:  # bytes_list
            return [v for n, _, v in values if n == 1]
        if kind == 2:  # float_list: packed, or one fixed32 each
            raw = b"".join(v for n, _, v in values if n == 1)
            return np.frombuffer(raw, "<f4").astype(np.float32)
        if kind == 3:  # int64_list: packed varints, or one varint each
            ints = []
            for n, wire, v in values:
                if n != 1:
                    continue
                if wire == 2:
                    at = 0
                    while at < len(v):
                        x, at = _varint(v, at)
                        ints.append(x)
                else:
                    ints.append(v)
            return np.asarray(ints, np.uint64).astype(np.int64)
    return []


def type_of(value: Any) -> FeatureType:
    if isinstance(value, list):
        return "bytes" if len(value) == 1 else "bytes_list"
    kind = "int64" if value.dtype == np.int64 else "float32"
    return kind if len(value) == 1 else f"ragged:{kind}"


def spec_of(kind: FeatureType, name: str) -> FieldSpec:
    table = {
        "int64": FieldSpec((), np.dtype(np.int64)),
        "float32": FieldSpec((), np.dtype(np.float32)),
        "bytes": FieldSpec((), OBJECT),
        "bytes_list": FieldSpec((), OBJECT),
        "ragged:int64": FieldSpec((None,), np.dtype(np.int64)),
        "ragged:float32": FieldSpec((None,), np.dtype(np.float32)),
    }
    if kind not in table:
        raise ValueError(f"features: {name!r} has type {kind!r}; pass one of {sorted(table)}.")
    return table[kind]
