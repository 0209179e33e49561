"""TensorBoard scalar events as bytes, built directly: the `Event` / `Summary` protobuf
messages tensorboardX would serialize, byte for byte (tests/test_event_bytes.py compares).

MindSpore forces protobuf's pure-Python implementation on the process, where building an
`Event` of ten scalars and serializing it costs the pipeline worker's CPU with the GIL
held; these few lines of framing cost a tenth of that (docs/performance.md).

    Event:   wall_time (1, double) · step (2, int64) · summary (5, Summary)
    Summary: value (1, repeated Value)
    Value:   tag (1, string) · simple_value (2, float, in a oneof: written even when 0)
"""

from __future__ import annotations

import math
import struct
from collections.abc import Iterable

_DOUBLE = struct.Struct("<d")
_FLOAT = struct.Struct("<f")
_FLOAT_MAX = 3.4028234663852886e38


def _varint(value: int) -> bytes:
    value &= 0xFFFF_FFFF_FFFF_FFFF  # int64: a negative number is its 64-bit two's complement
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _float32(value: float) -> bytes:
    # protobuf stores a double beyond float's range as ±inf; struct would raise.
    if not -_FLOAT_MAX <= value <= _FLOAT_MAX and not math.isnan(value):
        value = math.copysign(math.inf, value)
    return _FLOAT.pack(value)


def scalar_event(wall_time: float, step: int, scalars: Iterable[tuple[str, float]]) -> bytes:
    """One serialized `Event` holding a `Summary` of `simple_value`s, in the given order."""
    summary = bytearray()
    for tag, value in scalars:
        name = tag.encode()
        item = b"\x0a" + _varint(len(name)) + name + b"\x15" + _float32(value)
        summary += b"\x0a" + _varint(len(item)) + item
    event = bytearray()
    if wall_time:  # proto3: a default value is not written
        event += b"\x09" + _DOUBLE.pack(wall_time)
    if step:
        event += b"\x10" + _varint(step)
    event += b"\x2a" + _varint(len(summary)) + summary
    return bytes(event)
