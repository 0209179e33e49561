"""Parsers for `npu-smi` text, keyed by names and tolerant of driver differences.

Forms (recorded examples in tests/fixtures/npu_smi/):
- `npu-smi info`: a box-drawn table with two rows per chip, whose header rows name the
  columns, followed by a process table; its title row carries the driver version;
- `npu-smi info -t usages -i N`, `-t common -i N` and `-t ecc -i N`: `Key : value` lines,
  one block per chip, each with a `Chip ID` line (last in `usages` and `ecc`, first in
  `common`);
- `npu-smi info -t health -i N -c C` and `-t board -i N -c C`: `Key : value` lines for one
  chip (`Health Status`, `Error Code`; `Chip Name`, `Firmware Version`, ...).

Drivers rename keys (`Memory ...` became `DDR ...`), add some (`NPU Utilization(%)`), print
`-` or `NA` where they have no value, and A3 boards carry two chips per NPU. Columns and
keys are looked up by name; unknown ones are ignored and missing values are left out.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field

from otel_mindformers.devices.source import SourceError

# Canonical field names; each carries its unit.
AICORE = "aicore_percent"
AIVECTOR = "aivector_percent"
AICPU = "aicpu_percent"
CTRLCPU = "ctrlcpu_percent"
OVERALL = "npu_percent"
HBM_USED = "hbm_used_mb"
HBM_TOTAL = "hbm_total_mb"
HBM_USAGE = "hbm_usage_percent"
DDR_USED = "ddr_used_mb"
DDR_TOTAL = "ddr_total_mb"
DDR_USAGE = "ddr_usage_percent"
TEMPERATURE = "temperature_c"
POWER = "power_w"
AICORE_RATED_MHZ = "aicore_rated_mhz"
AICORE_CURRENT_MHZ = "aicore_current_mhz"

# `Key : value` forms: normalised key (lower case, no spaces) -> field.
_KEYS = {
    "aicoreusagerate(%)": AICORE,
    "aivectorusagerate(%)": AIVECTOR,
    "aicpuusagerate(%)": AICPU,
    "ctrlcpuusagerate(%)": CTRLCPU,
    "npuutilization(%)": OVERALL,
    "hbmcapacity(mb)": HBM_TOTAL,
    "hbmusagerate(%)": HBM_USAGE,
    "ddrcapacity(mb)": DDR_TOTAL,
    "memorycapacity(mb)": DDR_TOTAL,
    "ddrusagerate(%)": DDR_USAGE,
    "memoryusagerate(%)": DDR_USAGE,
    "temperature(c)": TEMPERATURE,
    "npureal-timepower(w)": POWER,
    "aicorefreq(mhz)": AICORE_RATED_MHZ,
    "aicorecurfreq(mhz)": AICORE_CURRENT_MHZ,
}
_CHIP_ID_KEY = "chipid"

# `-t ecc` keys: "{DDR|HBM} {Single|Double} Bit {Error Count|Aggregate Total Err Cnt|Isolated
# Pages Count}". A single-bit error is corrected, a double-bit one is not.
ECC_COUNT, ECC_AGGREGATE, ECC_ISOLATED_PAGES = "count", "aggregate", "isolated_pages"
_ECC_KINDS = {"errorcount": ECC_COUNT, "aggregatetotalerrcnt": ECC_AGGREGATE,
              "isolatedpagescount": ECC_ISOLATED_PAGES}  # fmt: skip
_ECC_KEY = re.compile(r"^(ddr|hbm)(single|double)bit(" + "|".join(_ECC_KINDS) + r")$")
_TITLE_VERSION = re.compile(r"\bversion:\s*(\S+)", re.IGNORECASE)

# Table columns: lower-case header word -> field; a pair maps "used / total" cells.
_COLUMNS: dict[str, str | tuple[str, str]] = {
    "npu": "npu",
    "name": "model",
    "health": "health",
    "chip": "chip",
    "phy-id": "device",  # A3: the chip's device id
    "device": "device",  # inference cards: the chip's device id
    "bus-id": "bus_id",
    "power(w)": POWER,
    "temp(c)": TEMPERATURE,
    "aicore(%)": AICORE,
    "memory-usage(mb)": (DDR_USED, DDR_TOTAL),
    "hbm-usage(mb)": (HBM_USED, HBM_TOTAL),
}
_TEXT_FIELDS = frozenset({"model", "health", "bus_id"})
_INT_FIELDS = frozenset({"npu", "chip", "device"})


class NpuSmiParseError(SourceError):
    def __init__(self, message: str) -> None:
        super().__init__("parse", message)


def number(text: str) -> float | None:
    """A finite number, or None for `-`, `NA`, blanks and anything else."""
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def _integer(text: str) -> int | None:
    return int(text) if text.isdigit() else None


# --- `-t usages` / `-t common` -----------------------------------------------------------


@dataclass(frozen=True)
class ChipBlock:
    chip_id: int | None  # None when the driver prints no `Chip ID` (single-chip boards)
    values: dict[str, float]


def key_value_blocks(text: str) -> list[dict[str, str]]:
    """`Key : value` lines in blocks, keys without spaces in lower case.

    A block ends where a key repeats, which finds chip boundaries whether `Chip ID` opens
    or closes each block and whether or not blank lines separate them.
    """
    raw_blocks: list[dict[str, str]] = []
    current: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        key = "".join(key.split()).lower()
        if not sep or not key:
            continue
        if key in current:
            raw_blocks.append(current)
            current = {}
        current[key] = value.strip()
    if current:
        raw_blocks.append(current)
    return raw_blocks


def _per_chip(text: str, read: Callable[[dict[str, str]], dict], form: str) -> list[tuple[int | None, dict]]:
    """(chip id, values) of each `Key : value` block where `read` finds a value."""
    found = [(_integer(raw.get(_CHIP_ID_KEY, "")), values) for raw in key_value_blocks(text) if (values := read(raw))]
    if not found:
        raise NpuSmiParseError(f"no known `Key : value` lines in the `{form}` output")
    return found


def _usage_values(raw: dict[str, str]) -> dict[str, float]:
    return {name: value for key, name in _KEYS.items() if (value := number(raw.get(key, ""))) is not None}


def parse_chip_blocks(text: str, form: str = "npu-smi info -t usages") -> list[ChipBlock]:
    """One ChipBlock per `-t usages` / `-t common` chip block with a known value; `form`,
    the command that printed `text`, is what a parse error names."""
    return [ChipBlock(chip, values) for chip, values in _per_chip(text, _usage_values, form)]


# --- `-t ecc`, `-t health`, `-t board` --------------------------------------------------------


@dataclass(frozen=True)
class EccBlock:
    chip_id: int | None
    # (memory "hbm"/"ddr", "corrected"/"uncorrected", ECC_COUNT/ECC_AGGREGATE/ECC_ISOLATED_PAGES)
    values: dict[tuple[str, str, str], float]


def _ecc_values(raw: dict[str, str]) -> dict[tuple[str, str, str], float]:
    values = {}
    for key, text_value in raw.items():
        if (match := _ECC_KEY.match(key)) and (value := number(text_value)) is not None:
            memory, bits, kind = match.groups()
            values[(memory, "corrected" if bits == "single" else "uncorrected", _ECC_KINDS[kind])] = value
    return values


def parse_ecc(text: str) -> list[EccBlock]:
    """One EccBlock per chip of `npu-smi info -t ecc -i N`; `NA` counters are left out."""
    return [EccBlock(chip, values) for chip, values in _per_chip(text, _ecc_values, "npu-smi info -t ecc")]


# Values npu-smi prints for "no value".
_ABSENT = frozenset({"", "-", "na", "n/a", "not supported"})


@dataclass(frozen=True)
class ChipHealth:
    status: str | None  # OK, Warning, Alarm, Critical
    error_codes: tuple[str, ...]  # "0x80E01801", ...; empty when the chip reports none


def parse_health(text: str) -> ChipHealth:
    """`npu-smi info -t health -i N -c C`. Error codes are hex words separated by spaces or
    commas, with or without `0x` (what MindCluster's fault diagnosis accepts); `NA` is none."""
    raw = next((block for block in key_value_blocks(text) if "healthstatus" in block), None)
    if raw is None:
        raise NpuSmiParseError("no `Health Status` line in the `npu-smi info -t health` output")
    codes = []
    for word in re.split(r"[\s,]+", raw.get("errorcode", "")):
        digits = word[2:] if word.lower().startswith("0x") else word
        if digits and re.fullmatch(r"[0-9A-Fa-f]{1,16}", digits) and int(digits, 16):
            codes.append(f"0x{digits.upper()}")
    status = raw["healthstatus"]
    return ChipHealth(None if status.lower() in _ABSENT else status, tuple(dict.fromkeys(codes)))


@dataclass(frozen=True)
class ChipBoard:
    name: str | None = None  # Chip Type + Chip Name: "Ascend910B4"
    firmware_version: str | None = None
    serial_number: str | None = None


def parse_board(text: str) -> ChipBoard:
    """`npu-smi info -t board -i N -c C`; fields the board does not print stay None (most
    drivers print no serial number there)."""
    raw: dict[str, str] = {}
    for block in key_value_blocks(text):
        raw.update(block)

    def field_(key: str) -> str | None:
        value = raw.get(key, "").strip()
        return None if value.lower() in _ABSENT else value

    chip_name = field_("chipname")
    name = "".join(part for part in (field_("chiptype"), chip_name) if part) or None
    board = ChipBoard(name, field_("firmwareversion"), field_("serialnumber"))
    if board == ChipBoard():
        raise NpuSmiParseError("no board fields in the `npu-smi info -t board` output")
    return board


# --- `npu-smi info` table ----------------------------------------------------------------


@dataclass(frozen=True)
class NpuChip:
    npu_id: int
    chip_id: int
    device_id: int | None  # from a Phy-ID / Device column, when the table has one
    model: str | None = None
    health: str | None = None
    bus_id: str | None = None
    values: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class NpuProcess:
    npu_id: int
    chip_id: int
    pid: int
    name: str
    memory_mb: float


@dataclass(frozen=True)
class NpuTable:
    chips: tuple[NpuChip, ...]
    processes: tuple[NpuProcess, ...]
    driver_version: str | None = None  # the title row's `Version:`


def _tokens(cell: str) -> list[str]:
    return re.sub(r"\s*/\s*", "/", cell).split()


def _row_fields(cells: list[str], header: list[list[str]]) -> dict[str, object]:
    """Values of one data row, named by the header row above it.

    A cell with fewer values than its header has columns is skipped (no guessing which one
    is missing); extra words go to the last column (model names may contain spaces).
    """
    fields: dict[str, object] = {}
    for cell, names in zip(cells, header):
        tokens = _tokens(cell)
        if not names or len(tokens) < len(names):
            continue
        tokens = tokens[: len(names) - 1] + [" ".join(tokens[len(names) - 1 :])]
        for name, token in zip(names, tokens):
            target = _COLUMNS.get(name)
            if isinstance(target, tuple):
                used, _, total = (number(text) for text in token.partition("/"))
                if used is not None and total:  # `0 / 0`: the board does not expose it
                    fields[target[0]], fields[target[1]] = used, total
            elif target in _TEXT_FIELDS:
                fields[target] = token
            elif target in _INT_FIELDS:
                if (integer := _integer(token)) is not None:
                    fields[target] = integer
            elif target is not None and (value := number(token)) is not None:
                fields[target] = value
    return fields


def _chip(fields: dict[str, object]) -> NpuChip | None:
    if "npu" not in fields:
        return None
    values = {k: v for k, v in fields.items() if isinstance(v, float)}
    npu, chip, device = fields["npu"], fields.get("chip", 0), fields.get("device")
    if not isinstance(npu, int) or not isinstance(chip, int):
        return None
    return NpuChip(
        npu_id=npu,
        chip_id=chip,
        device_id=device if isinstance(device, int) else None,
        model=_text(fields.get("model")),
        health=_text(fields.get("health")),
        bus_id=_text(fields.get("bus_id")),
        values=values,
    )


def _text(value: object) -> str | None:
    return value if isinstance(value, str) else None


def _process(cells: list[str]) -> NpuProcess | None:
    if len(cells) < 4:
        return None
    parsed = [_integer(token) for token in cells[0].split()]
    ids = [i for i in parsed if i is not None]
    pid, memory = _integer(cells[1]), number(cells[3])
    if not ids or len(ids) < len(parsed) or pid is None or memory is None:
        return None
    return NpuProcess(ids[0], ids[1] if len(ids) > 1 else 0, pid, cells[2], memory)


def parse_table(text: str) -> NpuTable:
    """Chips and processes of the plain `npu-smi info` table."""
    first_header: list[list[str]] | None = None
    second_header: list[list[str]] | None = None
    bus_column: int | None = None
    in_processes = False
    pending: dict[str, object] | None = None  # the first row of the chip being read
    chips: list[NpuChip] = []
    processes: list[NpuProcess] = []
    driver_version: str | None = None
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("+"):
            pending = None  # rows of one chip never straddle a rule
            continue
        if not line.startswith("|"):
            continue
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        lowered = [cell.lower() for cell in cells]
        if first_header is None and (title := _TITLE_VERSION.search(line)):
            driver_version = title.group(1)
        elif any(cell.startswith("process id") for cell in lowered):
            in_processes = True
        elif "health" in lowered:
            first_header, in_processes = [_tokens(c.lower()) for c in cells], False
        elif "bus-id" in lowered:
            second_header, bus_column = [_tokens(c.lower()) for c in cells], lowered.index("bus-id")
        elif in_processes:
            if (process := _process(cells)) is not None:
                processes.append(process)
        elif first_header is None or second_header is None or bus_column is None:
            continue
        elif len(cells) == len(second_header) and ":" in cells[bus_column]:
            if pending is not None and (chip := _chip({**pending, **_row_fields(cells, second_header)})):
                chips.append(chip)
        elif len(cells) == len(first_header):
            pending = _row_fields(cells, first_header)
    if not chips:
        raise NpuSmiParseError("no NPU rows in the `npu-smi info` table")
    return NpuTable(tuple(chips), tuple(processes), driver_version)
