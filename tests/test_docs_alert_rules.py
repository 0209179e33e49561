"""The alert lists of the docs are the rules shipped in collector-config/rules/: every alert
is listed, with its severity, and every alert named is one that exists."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from tests.support.paths import REPO, RULE_FILES

# Docs that list every shipped alert in a table row: | `Name` | severity | ...
LISTS = [REPO / "docs" / "alerts.md", REPO / "collector-config" / "README.md"]
# Names that appear in prose but are no rule: the README's hand-made test alert.
NOT_RULES = {"MindformersTest"}


def shipped_alerts() -> dict[str, str]:
    """Alert name → severity, from every rule file."""
    return {
        rule["alert"]: rule["labels"]["severity"]
        for path in RULE_FILES
        for group in yaml.safe_load(path.read_text())["groups"]
        for rule in group["rules"]
        if "alert" in rule
    }


def listed_alerts(doc: Path) -> dict[str, str]:
    rows = re.findall(r"^\| `(Mindformers\w+)` \| (\w+) \|", doc.read_text(), re.M)
    return dict(rows)


@pytest.mark.parametrize("doc", LISTS, ids=lambda p: str(p.relative_to(REPO)))
def test_the_doc_lists_every_shipped_alert_with_its_severity(doc):
    assert listed_alerts(doc) == shipped_alerts()


@pytest.mark.parametrize(
    "doc", sorted({*LISTS, REPO / "README.md", *(REPO / "docs").glob("*.md")}), ids=lambda p: str(p.relative_to(REPO))
)
def test_every_alert_a_doc_names_exists(doc):
    named = set(re.findall(r"\bMindformers[A-Z]\w+", doc.read_text())) - NOT_RULES
    assert named <= set(shipped_alerts()), named - set(shipped_alerts())
