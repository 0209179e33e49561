"""Parameter names → the layer and the kind of block they belong to, and MindFormers'
`target` / `invert` filter.

Names follow MindFormers' and MindSpore's spelling (`model.layers.3.attention.wq.weight`,
`lm_head.weight`); other checkpoints' spellings (`h.3.attn`, `blocks.3.mlp`,
`q_proj`, `down_proj`) are recognised too. A name without a layer index (embeddings, the
head, the final norm) has no layer; a name no pattern knows is of kind `other`.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Sequence

# The aggregation kinds, in the order tables and panels show them.
KINDS: tuple[str, ...] = ("embedding", "attention", "mlp", "norm", "head", "other")

_LAYER = re.compile(r"(?:^|\.)(?:layers|layer|blocks|block|h)\.(\d+)(?:\.|$)")
# First match wins: `attention_norm` is a norm, `lm_head` is the head.
_KIND_PATTERNS: tuple[tuple[str, re.Pattern[str]], ...] = tuple(
    (kind, re.compile(pattern))
    for kind, pattern in (
        ("head", r"(?:^|\.)(?:lm_head|head|output_layer|classifier)(?:\.|$)"),
        ("embedding", r"embed|(?:^|\.)(?:wte|wpe|tok_emb\w*)(?:\.|$)"),
        ("norm", r"norm|(?:^|\.)ln(?:_\w+|\d*)(?:\.|$)"),
        ("attention", r"atten|attn|(?:^|\.)(?:w[qkvo]|wqkv|w_qkv|[qkvo]_proj|qkv\w*|query|key|value|dense_o)(?:\.|$)"),
        ("mlp", r"feed_forward|mlp|ffn|expert|router|(?:^|\.)(?:w[123]|gate_proj|up_proj|down_proj|fc\d*)(?:\.|$)"),
    )
)


@functools.lru_cache(maxsize=8192)
def layer_of(name: str) -> str | None:
    """The transformer layer index as text (`"3"`), or None for parameters outside layers."""
    match = _LAYER.search(name)
    return match.group(1) if match else None


@functools.lru_cache(maxsize=8192)
def kind_of(name: str) -> str:
    for kind, pattern in _KIND_PATTERNS:
        if pattern.search(name):
            return kind
    return "other"


class ParameterFilter:
    """MindFormers' `monitor_config.target` / `invert`: a parameter is selected when one of
    the regexes matches somewhere in its name (`re.search`), or, with `invert`, when none
    does. Without a `target` nothing is selected: per-parameter series exist only for the
    parameters someone asked for. At most `cap` names are selected (the first by name)."""

    def __init__(self, target: Sequence[str] | None, invert: bool = False, cap: int = 64) -> None:
        self.patterns = tuple(re.compile(p) for p in (target or ()))
        self.invert = bool(invert)
        self.cap = cap

    @property
    def selects_any(self) -> bool:
        return bool(self.patterns) and self.cap > 0

    def matches(self, name: str) -> bool:
        hit = any(p.search(name) for p in self.patterns)
        return hit != self.invert

    def select(self, names: Iterable[str]) -> list[str]:
        """The selected names, sorted, at most `cap` of them."""
        if not self.selects_any:
            return []
        return sorted(n for n in names if self.matches(n))[: self.cap]
