"""A StepRecord's values in the metric table's order: what lines people read, the JSON line
and the non-finite list are built from. The order of a key set is worked out once per run;
the values are the record's own on every call."""

from __future__ import annotations

import math

from hypothesis import given
from hypothesis import strategies as st

from otel_mindformers.core.step_record import StepRecord
from otel_mindformers.names.training import ORDER

TABLE = list(ORDER)
KEYS = st.sampled_from(TABLE + ["custom_a", "custom_b", "custom_c"])
VALUES = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.booleans())


def _rank(key: str) -> int:
    return ORDER.get(key, len(ORDER))


@given(st.dictionaries(KEYS, VALUES, max_size=12), st.dictionaries(KEYS, VALUES, max_size=12))
def test_values_come_in_the_table_order_with_the_records_own_values(first, second):
    for values in (first, second, dict(reversed(list(first.items())))):
        record = StepRecord(step=1, epoch=1, rank=0, time_stamp=1.0, values=dict(values))
        ordered = record.ordered_values()
        assert sorted(ordered) == sorted(values.items())  # every value, its own
        ranks = [_rank(key) for key, _ in ordered]
        assert ranks == sorted(ranks)
        # Keys the table does not know keep the order they were added in, after the table's.
        unknown = [key for key in values if key not in ORDER]
        assert [key for key, _ in ordered if key not in ORDER] == unknown
        bad = record.nonfinite()
        assert bad == [key for key, value in ordered if isinstance(value, float) and not math.isfinite(value)]


def test_the_same_keys_with_new_values_give_the_new_values():
    record = StepRecord(step=1, epoch=1, rank=0, time_stamp=1.0, values={"grad_norm": 1.0, "loss": 2.0})
    assert record.ordered_values() == [("loss", 2.0), ("grad_norm", 1.0)]
    record.values["loss"] = math.inf
    record.values["grad_norm"] = math.nan
    assert record.ordered_values()[0] == ("loss", math.inf)
    assert record.nonfinite() == ["loss", "grad_norm"]
