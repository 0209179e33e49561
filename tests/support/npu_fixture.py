"""What the recorded npu-smi output the fake tool answers with (tests/fixtures/npu_smi/910b)
says about the test rank's chip."""

from __future__ import annotations

from otel_mindformers.names import semconv

# The chip's identity as the 910b fixture's table title and `-t board` print it.
NPU1_IDENTITY = {
    semconv.ATTR_HW_NAME: "NPU 1 chip 0",
    semconv.ATTR_HW_DRIVER_VERSION: "23.0.rc3",
    semconv.ATTR_HW_FIRMWARE_VERSION: "7.1.0.7.220",
}
