"""The page's one way to write markup: elements built from a tag, attributes and children,
every string escaped on its way in.

The page shows strings from files anyone may have written (job ids, file and folder names,
phase, rule and operator names, alert messages), and people open it from shared folders.
So no markup is written by hand anywhere else: `el` escapes every attribute value and every
child that is not already `Html` (what `el` built), `data_block` writes JSON that holds no
`<`, `>` or `&` at all, and `inline` refuses script or style text that could end its element
early. A string that reaches the page by mistake shows as text, never as markup.
`tests/test_analysis_html.py` checks that the page's modules hold no markup literal.

Inline scripts and styles run under the page's Content-Security-Policy by their SHA-256
(`csp_source`), computed when the page is written: no other script can run in it.
"""

from __future__ import annotations

import base64
import hashlib
import html
import json
import re
from collections.abc import Sequence
from typing import Literal, Union

__all__ = ["Child", "Html", "csp_source", "data_block", "el", "inline", "join"]


class Html(str):
    """Markup `el` built: as a child of another element it goes in as it is."""

    __slots__ = ()


Child = Union[Html, str, int, float, None, Sequence["Child"]]
Attribute = Union[str, int, float, bool, None]

# Elements written `<tag .../>` when they have no children: HTML's void elements the page
# uses, and the SVG shapes (SVG, foreign content in HTML, allows the self-closing form).
_EMPTY = frozenset({"meta", "rect", "line", "path"})
_NAME = re.compile(r"[a-zA-Z][a-zA-Z0-9]*(-[a-zA-Z0-9]+)*\Z")
_names: dict[str, str] = {}  # a keyword argument → its attribute name, checked once
_tags: set[str] = set()  # element names checked


def _attribute_name(keyword: str) -> str:
    """`class_` → `class`, `data_value` → `data-value`, `viewBox` as it is."""
    name = _names.get(keyword)
    if name is None:
        name = keyword.rstrip("_").replace("_", "-")
        if not _NAME.match(name):
            raise ValueError(f"not an attribute name: {keyword!r}")
        _names[keyword] = name
    return name


def _text(value: object) -> str:
    return html.escape(str(value), quote=False)


def _attribute(value: object) -> str:
    """A value inside double quotes (the only way `el` quotes one)."""
    return html.escape(str(value), quote=False).replace('"', "&quot;")


def _children(children: Sequence[Child], out: list[str]) -> None:
    for child in children:
        if child is None:
            continue
        if isinstance(child, Html):
            out.append(child)
        elif isinstance(child, (str, int, float)):
            out.append(_text(child))
        else:
            _children(child, out)


def el(tag: str, *children: Child, **attributes: Attribute) -> Html:
    """`<tag a="v">children</tag>`: attribute values and string children escaped; an
    attribute that is None or False is left out, True is written bare (`hidden`)."""
    if tag not in _tags:
        if not _NAME.match(tag):
            raise ValueError(f"not an element name: {tag!r}")
        _tags.add(tag)
    opened = [tag]
    for keyword, value in attributes.items():
        if value is None or value is False:
            continue
        name = _attribute_name(keyword)
        opened.append(name if value is True else f'{name}="{_attribute(value)}"')
    start = " ".join(opened)
    if not children and tag in _EMPTY:
        return Html(f"<{start}/>")
    inner: list[str] = []
    _children(children, inner)
    return Html(f"<{start}>{''.join(inner)}</{tag}>")


def join(*children: Child) -> Html:
    """Children side by side, with no element around them."""
    inner: list[str] = []
    _children(children, inner)
    return Html("".join(inner))


def data_block(css_class: str, data: object) -> Html:
    """Data for the page's script as a JSON block (not run: `type="application/json"`). Its
    text holds no `<`, `>` or `&` (written as JSON's \\u escapes), so nothing in the data can
    end the block or start a comment that would swallow the rest of the page."""
    text = json.dumps(data, separators=(",", ":"), allow_nan=False)
    text = text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
    return Html(f'<script type="application/json" class="{_attribute(css_class)}">{text}</script>')


def inline(tag: Literal["script", "style"], source: str) -> Html:
    """The page's own script or stylesheet, inline; refused if its text could end the element
    early or open a comment in it."""
    lowered = source.lower()
    if f"</{tag}" in lowered or "<!--" in source:
        raise ValueError(f"an inline {tag} must not hold '</{tag}' or '<!--'")
    return Html(f"<{tag}>{source}</{tag}>")


def csp_source(source: str) -> str:
    """The Content-Security-Policy source that lets exactly this inline script or style run."""
    digest = hashlib.sha256(source.encode("utf-8")).digest()
    return f"'sha256-{base64.b64encode(digest).decode('ascii')}'"
