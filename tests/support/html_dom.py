"""An HTML document read back into elements (the standard library's parser): what a test
counts in a page, or in the DOM a browser dumped after running the page's scripts."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from html.parser import HTMLParser

_VOID = frozenset({"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "wbr"})


@dataclass
class Element:
    tag: str
    attrs: dict[str, str]
    parent: Element | None = field(default=None, repr=False)
    children: list[Element] = field(default_factory=list, repr=False)
    texts: list[str] = field(default_factory=list, repr=False)

    @property
    def classes(self) -> set[str]:
        return set(self.attrs.get("class", "").split())

    def walk(self) -> Iterator[Element]:
        for child in self.children:
            yield child
            yield from child.walk()

    def all(self, tag: str | None = None, cls: str | None = None) -> list[Element]:
        """Descendants with this tag and class."""
        return [e for e in self.walk() if (tag is None or e.tag == tag) and (cls is None or cls in e.classes)]

    def by_id(self, wanted: str) -> Element:
        found = [e for e in self.walk() if e.attrs.get("id") == wanted]
        assert len(found) == 1, f"{len(found)} elements with id {wanted!r}"
        return found[0]

    def text(self) -> str:
        return "".join(self.texts) + "".join(child.text() for child in self.children)


class _Reader(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.root = Element("#document", {})
        self.open = self.root

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        element = Element(tag, {k: v or "" for k, v in attrs}, self.open)
        self.open.children.append(element)
        if tag not in _VOID:
            self.open = element

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.open.children.append(Element(tag, {k: v or "" for k, v in attrs}, self.open))

    def handle_endtag(self, tag: str) -> None:
        element: Element | None = self.open
        while element is not None and element.tag != tag:
            element = element.parent
        if element is not None and element.parent is not None:
            self.open = element.parent

    def handle_data(self, data: str) -> None:
        self.open.texts.append(data)


def parse(text: str) -> Element:
    reader = _Reader()
    reader.feed(text)
    reader.close()
    return reader.root
