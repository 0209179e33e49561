"""npu-smi text parsers against recorded output of every form (tests/fixtures/npu_smi/)."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from otel_mindformers.devices import npu_smi as f
from otel_mindformers.devices.npu_smi import (
    NpuSmiParseError,
    parse_board,
    parse_chip_blocks,
    parse_ecc,
    parse_health,
    parse_table,
)
from tests.support import paths

FIXTURES = paths.FIXTURES / "npu_smi"


def text(name: str, pid: int = 4242) -> str:
    # The fake npu-smi puts its caller's pid where the fixture says @PPID@.
    return (FIXTURES / name).read_text(errors="replace").replace("@PPID@", str(pid))


def test_910b_table_chips_by_column_name():
    table = parse_table(text("910b/info.txt"))
    npu0, npu1 = table.chips
    assert (npu0.npu_id, npu0.chip_id, npu0.device_id) == (0, 0, None)
    assert (npu0.model, npu0.health, npu0.bus_id) == ("910B4", "OK", "0000:C1:00.0")
    assert npu0.values == {f.POWER: 91.3, f.TEMPERATURE: 33.0, f.AICORE: 12.0, f.HBM_USED: 3197.0, f.HBM_TOTAL: 32768.0}
    assert npu1.health == "Warning" and npu1.values[f.HBM_USED] == 21504.0
    # `0 / 0` DDR means the board does not expose it, not "zero of zero".
    assert f.DDR_TOTAL not in npu0.values and f.DDR_USED not in npu1.values


def test_910b_process_table():
    table = parse_table(text("910b/info.txt", pid=777))
    assert [(p.npu_id, p.chip_id, p.pid, p.name, p.memory_mb) for p in table.processes] == [
        (0, 0, 2235143, "python", 2867.0),
        (1, 0, 777, "python", 18432.0),
    ]


def test_a3_two_chips_per_npu_with_dash_values():
    table = parse_table(text("a3/info.txt"))
    ids = [(c.npu_id, c.chip_id, c.device_id) for c in table.chips]
    assert ids == [(0, 0, 0), (0, 1, 1), (1, 0, 2), (1, 1, 3)]
    second = table.chips[1]
    assert f.POWER not in second.values  # printed as `-`
    assert second.values[f.TEMPERATURE] == 37.0 and second.values[f.HBM_USED] == 40448.0
    assert table.chips[3].health == "Critical"
    assert [(p.npu_id, p.chip_id, p.memory_mb) for p in table.processes][1] == (0, 1, 37376.0)


def test_old_driver_table_has_ddr_and_no_processes():
    table = parse_table(text("old_driver/info.txt"))
    (chip,) = table.chips
    assert chip.model == "910A"
    assert chip.values[f.DDR_USED] == 2703.0 and chip.values[f.DDR_TOTAL] == 15039.0
    assert chip.values[f.HBM_USED] == 0.0 and chip.values[f.HBM_TOTAL] == 32768.0
    assert table.processes == ()


def test_truncated_table_keeps_the_complete_chips():
    table = parse_table(text("malformed/info_truncated.txt"))
    assert [c.npu_id for c in table.chips] == [0]


@pytest.mark.parametrize("parse", [parse_table, parse_chip_blocks])
def test_garbage_is_a_parse_error(parse):
    with pytest.raises(NpuSmiParseError) as raised:
        parse(text("malformed/garbage.txt"))
    assert raised.value.error_type == "parse"


def test_usages_newer_driver_ddr_naming_and_npu_utilization():
    (block,) = parse_chip_blocks(text("910b/usages_1.txt"))
    assert block.chip_id == 0
    assert block.values == {
        f.DDR_TOTAL: 15171.0,
        f.DDR_USAGE: 6.0,
        f.HBM_TOTAL: 32768.0,
        f.HBM_USAGE: 65.0,
        f.AICORE: 47.0,
        f.AIVECTOR: 38.0,
        f.AICPU: 1.0,
        f.CTRLCPU: 5.0,
        f.OVERALL: 52.0,
    }


def test_usages_older_driver_memory_naming_without_chip_id():
    (block,) = parse_chip_blocks(text("old_driver/usages_0.txt"))
    assert block.chip_id is None
    assert block.values[f.DDR_TOTAL] == 15039.0 and block.values[f.DDR_USAGE] == 18.0
    assert f.AIVECTOR not in block.values and f.OVERALL not in block.values


def test_usages_a3_one_block_per_chip():
    first, second = parse_chip_blocks(text("a3/usages_0.txt"))
    assert (first.chip_id, second.chip_id) == (0, 1)
    assert first.values[f.AICORE] == 31.0 and second.values[f.AICORE] == 29.0
    assert f.CTRLCPU in first.values and f.CTRLCPU not in second.values  # `-`


def test_chip_blocks_split_without_blank_lines():
    packed = "\n".join(line for line in text("a3/usages_0.txt").splitlines() if line.strip())
    assert [b.chip_id for b in parse_chip_blocks(packed)] == [0, 1]


def test_common_chip_id_first_after_npu_header():
    first, second = parse_chip_blocks(text("a3/common_0.txt"))
    assert (first.chip_id, second.chip_id) == (0, 1)
    assert first.values[f.POWER] == 176.4 and second.values[f.POWER] == 85.6
    assert second.values[f.TEMPERATURE] == 37.0


def test_common_na_power_is_missing():
    _, second = parse_chip_blocks(text("a3/common_1.txt"))
    assert f.POWER not in second.values and second.values[f.TEMPERATURE] == 39.0


def test_bad_values_are_left_out():
    (block,) = parse_chip_blocks(text("malformed/usages_bad_values.txt"))
    # NA, N/A, -, 1e999 (inf), nan, words and a line without a value: only real numbers stay.
    assert block.values == {f.HBM_TOTAL: 32768.0, f.OVERALL: 7.0}


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.sampled_from(list("|+-=: /%()\n\t0123456789.aAbHCDRMNUchipIdBus-")), max_size=400))
def test_parsers_fail_only_with_parse_errors(garbage):
    for parse in (parse_table, parse_chip_blocks):
        try:
            parse(garbage)
        except NpuSmiParseError:
            pass


# --- `-t ecc`, `-t health`, `-t board`, the title's driver version ---------------------------------


def test_fixture_910b_title_row_carries_the_driver_version():
    assert parse_table(text("910b/info.txt")).driver_version == "23.0.rc3"
    assert parse_table(text("old_driver/info.txt")).driver_version == "21.0.4"


def test_fixture_910b_ecc_counts_aggregates_and_isolated_pages_without_ddr():
    (block,) = parse_ecc(text("910b/ecc_1.txt"))
    assert block.chip_id == 0
    assert block.values == {
        ("hbm", "corrected", f.ECC_COUNT): 3.0,
        ("hbm", "uncorrected", f.ECC_COUNT): 0.0,
        ("hbm", "corrected", f.ECC_AGGREGATE): 17.0,
        ("hbm", "uncorrected", f.ECC_AGGREGATE): 0.0,
        ("hbm", "corrected", f.ECC_ISOLATED_PAGES): 1.0,
        ("hbm", "uncorrected", f.ECC_ISOLATED_PAGES): 0.0,
    }  # every DDR line says NA on this board


def test_fixture_a3_ecc_one_block_per_chip():
    first, second = parse_ecc(text("a3/ecc_1.txt"))
    assert (first.chip_id, second.chip_id) == (0, 1)
    assert second.values[("hbm", "uncorrected", f.ECC_AGGREGATE)] == 2.0
    assert second.values[("ddr", "uncorrected", f.ECC_COUNT)] == 0.0


@pytest.mark.parametrize(
    "name, status, codes",
    [
        ("910b/health_0_0.txt", "OK", ()),
        ("910b/health_1_0.txt", "Warning", ("0x80E18005",)),
        ("a3/health_1_1.txt", "Critical", ("0x80E01801", "0x80E01809")),
    ],
)
def test_fixture_health_status_and_error_codes(name, status, codes):
    health = parse_health(text(name))
    assert (health.status, health.error_codes) == (status, codes)


def test_health_error_codes_in_every_spelling_are_normalised_and_deduplicated():
    health = parse_health(" Health Status : Alarm\n Error Code : 80e01801,0x80E01801  0X8C084E00 NA -\n")
    assert health.error_codes == ("0x80E01801", "0x8C084E00")
    assert parse_health(" Health Status : NA\n Error Code : 0\n").error_codes == ()


def test_fixture_board_identity_and_missing_serial_number():
    board = parse_board(text("910b/board_1_0.txt"))
    assert board == f.ChipBoard(name="Ascend910B4", firmware_version="7.1.0.7.220", serial_number=None)
    assert parse_board("Serial Number : 102xx1234\nFirmware Version : NA\n").serial_number == "102xx1234"


@pytest.mark.parametrize("parse", [parse_ecc, parse_health, parse_board])
def test_new_forms_on_garbage_are_parse_errors(parse):
    with pytest.raises(NpuSmiParseError):
        parse(text("malformed/garbage.txt"))


@settings(max_examples=300, deadline=None)
@given(
    st.text(
        alphabet=st.sampled_from(
            list(": \n\t0123456789.xXaAbBcCdDeEfFNHMSBitErrorCountHealthStatusCodeChipIDFirmware")
        ),
        max_size=400,
    )
)
def test_ecc_health_board_parsers_fail_only_with_parse_errors(garbage):
    for parse in (parse_ecc, parse_health, parse_board):
        try:
            parse(garbage)
        except NpuSmiParseError:
            pass
