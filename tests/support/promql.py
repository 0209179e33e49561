"""What a PromQL expression selects: its vector selectors and the label names it uses."""

from __future__ import annotations

import promql_parser


def selectors(expr: str) -> list:
    found = []

    def visit(node) -> bool:
        if isinstance(node, promql_parser.VectorSelector):
            found.append(node)
        return True

    promql_parser.walk(promql_parser.parse(expr), visit)
    return found


def labels_used(expr: str) -> set[str]:
    """Label names in matchers, `by`/`without` and `on`/`ignoring`/`group_*` clauses."""
    used: set[str] = set()

    def visit(node) -> bool:
        if isinstance(node, promql_parser.VectorSelector):
            used.update(m.name for m in node.matchers.matchers)
        elif isinstance(node, promql_parser.AggregateExpr) and node.modifier is not None:
            used.update(node.modifier.labels)
        elif isinstance(node, promql_parser.BinaryExpr) and node.modifier is not None:
            modifier = node.modifier
            if modifier.matching is not None:
                used.update(modifier.matching.labels)
            used.update(modifier.group_labels or ())
        return True

    promql_parser.walk(promql_parser.parse(expr), visit)
    return used - {"__name__"}
