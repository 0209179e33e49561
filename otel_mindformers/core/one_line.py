"""An exception's message as one bounded line, for the places that show a run's end reason
beside other text: the ledger's `reason`, the run span's `training.stop_reason`, the
end-of-run notice, `report`'s table cell.

MindSpore frames its errors in dashed rules and appends the developer's call stacks: a
collective that failed because another node died reads "RuntimeError: \\n-----\\n- Kernel
error:\\n-----\\nLaunch kernel failed: Default/AllReduce-op0\\n\\n-----\\n- The Function Call
Stack: ..." over a few kilobytes. The worker's log keeps the whole traceback.
"""

from __future__ import annotations

MAX_REASON_CHARS = 300
# Where MindSpore's message turns to its call stacks (framework developers' sections).
_DEVELOPER_SECTIONS = ("- The Function Call Stack", "- C++ Call Stack")


def one_line(text: str, limit: int = MAX_REASON_CHARS) -> str:
    """`text`'s lines up to a developer's call stack, dashed rules and blank lines left out,
    joined by spaces; at most `limit` characters (the cut marked by an ellipsis)."""
    kept = []
    for line in text.splitlines():
        line = line.strip()
        if line.startswith(_DEVELOPER_SECTIONS):
            break
        if line.strip("-"):
            kept.append(line)
    joined = " ".join(kept)
    return joined if len(joined) <= limit else joined[: limit - 1] + "…"
