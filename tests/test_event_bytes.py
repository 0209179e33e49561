"""TensorBoard events built as bytes are the bytes tensorboardX's protobuf serializes."""

import math

import mindspore  # noqa: F401  (protobuf's pure-Python implementation, as in training)
import pytest
from tensorboardX.proto.event_pb2 import Event
from tensorboardX.proto.summary_pb2 import Summary

from otel_mindformers.outputs.event_bytes import scalar_event

CASES = [
    (1733000000.123456, 10, [("loss", 2.302585), ("learning_rate", 0.01), ("overflow", 0.0)]),
    (1733000000.0, 1, [("device/process_rss_bytes", 1.5e9), ("grad_norm/model.layers.0.attention.wq", 3e-7)]),
    (1.0, 2**40 + 3, [("x" * 200, -1.0)]),  # a two-byte length, a long varint
    (0.0, 0, []),  # defaults are not written; an empty summary is
    (5.5, -3, [("neg", -0.0)]),  # int64 as two's complement
    (7.0, 300, [("big", 1e39), ("small", -1e39), ("inf", math.inf), ("nan", math.nan), ("tiny", 1e-46)]),
    (8.0, 4, [("ünï", 1.0)]),  # tags are UTF-8
]


@pytest.mark.parametrize(("wall_time", "step", "scalars"), CASES)
def test_scalar_event_is_what_tensorboardx_serializes(wall_time, step, scalars):
    expected = Event(
        wall_time=wall_time,
        step=step,
        summary=Summary(value=[Summary.Value(tag=tag, simple_value=value) for tag, value in scalars]),
    ).SerializeToString()
    assert scalar_event(wall_time, step, scalars) == expected
