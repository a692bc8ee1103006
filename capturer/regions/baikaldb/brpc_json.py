"""brpc's json2pb / pb2json rules, for BaikalDB's HTTP+JSON calls.

brpc serves every protobuf method over HTTP; with a JSON body (any content type
that is not ``application/proto*``) it converts with json2pb, whose rules differ
from proto3's canonical JSON (``google.protobuf.json_format``):

* keys are the proto field names; unknown keys in a request are ignored;
* enums are written as names; on input a name or a number is accepted;
* ``bytes`` are standard base64 with padding, both ways;
* 64-bit integers are JSON integers (not strings); digit strings are accepted;
* unset optional fields and empty repeated fields are omitted;
* a missing ``required`` field in a request is an error ("Missing required field").

Used by the BaikalDB client (requests it sends, region and schema infos it
reads) and by the test double in ``tests/`` (what it reads and answers).
"""

from __future__ import annotations

import base64
import binascii
from typing import Any

from google.protobuf.descriptor import FieldDescriptor as FD
from google.protobuf.message import Message

_INTS = {FD.TYPE_INT32, FD.TYPE_INT64, FD.TYPE_UINT32, FD.TYPE_UINT64, FD.TYPE_SINT32,
         FD.TYPE_SINT64, FD.TYPE_FIXED32, FD.TYPE_FIXED64, FD.TYPE_SFIXED32, FD.TYPE_SFIXED64}
_RANGES = {
    FD.TYPE_INT32: (-(1 << 31), (1 << 31) - 1), FD.TYPE_SINT32: (-(1 << 31), (1 << 31) - 1),
    FD.TYPE_SFIXED32: (-(1 << 31), (1 << 31) - 1), FD.TYPE_UINT32: (0, (1 << 32) - 1),
    FD.TYPE_FIXED32: (0, (1 << 32) - 1), FD.TYPE_INT64: (-(1 << 63), (1 << 63) - 1),
    FD.TYPE_SINT64: (-(1 << 63), (1 << 63) - 1), FD.TYPE_SFIXED64: (-(1 << 63), (1 << 63) - 1),
    FD.TYPE_UINT64: (0, (1 << 64) - 1), FD.TYPE_FIXED64: (0, (1 << 64) - 1),
}


class JsonPbError(ValueError):
    """A JSON body does not fit the message (names the field path)."""


def _is_repeated(f: FD) -> bool:
    if hasattr(f, "is_repeated"):  # protobuf >= 6
        return bool(f.is_repeated)
    return bool(f.label == FD.LABEL_REPEATED)  # pragma: no cover - older protobuf


def _is_required(f: FD) -> bool:
    if hasattr(f, "is_required"):
        return bool(f.is_required)
    return bool(f.label == FD.LABEL_REQUIRED)  # pragma: no cover - older protobuf


def to_json(msg: Message) -> dict[str, Any]:
    """A message as brpc writes it (a dict for ``json.dumps``)."""
    out: dict[str, Any] = {}
    for f, value in msg.ListFields():  # set fields only; empty repeated ones are not listed
        if _is_repeated(f):
            out[f.name] = [_value_to_json(f, v) for v in value]
        else:
            out[f.name] = _value_to_json(f, value)
    return out


def _value_to_json(f: FD, v: Any) -> Any:
    if f.type == FD.TYPE_MESSAGE:
        return to_json(v)
    if f.type == FD.TYPE_ENUM:
        ev = f.enum_type.values_by_number.get(v)
        return ev.name if ev is not None else int(v)
    if f.type == FD.TYPE_BYTES:
        return base64.b64encode(v).decode("ascii")
    return v


def from_json(d: Any, msg: Message, path: str = "", lenient_enums: bool = False) -> Message:
    """Fill ``msg`` from a decoded JSON object, as json2pb does; raise ``JsonPbError``.

    ``lenient_enums``: an enum name this definition does not know (a newer
    server) leaves an optional field unset instead of failing."""
    if not isinstance(d, dict):
        raise JsonPbError(f"{path or msg.DESCRIPTOR.name}: expected a JSON object, got {type(d).__name__}")
    fields = msg.DESCRIPTOR.fields_by_name
    for key, value in d.items():
        f = fields.get(key)
        if f is None:
            continue  # unknown keys are ignored
        where = f"{path}.{key}" if path else key
        if value is None:
            continue
        if _is_repeated(f):
            if not isinstance(value, list):
                raise JsonPbError(f"{where}: expected an array")
            container = getattr(msg, key)
            for i, item in enumerate(value):
                if f.type == FD.TYPE_MESSAGE:
                    from_json(item, container.add(), f"{where}[{i}]", lenient_enums)
                else:
                    conv = _scalar(f, item, f"{where}[{i}]", lenient_enums)
                    if conv is not _SKIP:
                        container.append(conv)
        elif f.type == FD.TYPE_MESSAGE:
            from_json(value, getattr(msg, key), where, lenient_enums)
        else:
            conv = _scalar(f, value, where, lenient_enums and not _is_required(f))
            if conv is not _SKIP:
                setattr(msg, key, conv)
    missing = [f.name for f in msg.DESCRIPTOR.fields if _is_required(f) and not msg.HasField(f.name)]
    if missing:
        raise JsonPbError(f"Missing required field: {path + '.' if path else ''}{missing[0]}")
    return msg


_SKIP = object()


def _scalar(f: FD, v: Any, where: str, lenient_enums: bool) -> Any:
    t = f.type
    if t in _INTS:
        if isinstance(v, bool):
            raise JsonPbError(f"{where}: expected an integer, got a boolean")
        if isinstance(v, str):
            s = v[1:] if v.startswith("-") else v
            if not s.isdigit() or not s.isascii():
                raise JsonPbError(f"{where}: expected an integer, got {v!r}")
            v = int(v)
        if not isinstance(v, int):
            raise JsonPbError(f"{where}: expected an integer, got {v!r}")
        lo, hi = _RANGES[t]
        if not lo <= v <= hi:
            raise JsonPbError(f"{where}: {v} is out of range for {f.type}")
        return v
    if t == FD.TYPE_ENUM:
        et = f.enum_type
        if isinstance(v, str) and v in et.values_by_name:
            return et.values_by_name[v].number
        if isinstance(v, int) and not isinstance(v, bool) and v in et.values_by_number:
            return v
        if lenient_enums:
            return _SKIP
        raise JsonPbError(f"{where}: {v!r} is not a value of {et.name}")
    if t == FD.TYPE_BYTES:
        if not isinstance(v, str):
            raise JsonPbError(f"{where}: expected a base64 string")
        try:
            return base64.b64decode(v, validate=True)
        except (binascii.Error, ValueError):
            raise JsonPbError(f"{where}: not valid base64") from None
    if t == FD.TYPE_STRING:
        if not isinstance(v, str):
            raise JsonPbError(f"{where}: expected a string")
        return v
    if t == FD.TYPE_BOOL:
        if not isinstance(v, bool):
            raise JsonPbError(f"{where}: expected true or false")
        return v
    if t in (FD.TYPE_DOUBLE, FD.TYPE_FLOAT):
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise JsonPbError(f"{where}: expected a number")
        return float(v)
    raise JsonPbError(f"{where}: unsupported field type {t}")  # pragma: no cover
