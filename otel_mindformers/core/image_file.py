"""The image file a drawing command writes (`plot -o`, `capture --plot`), checked as argparse
reads it: matplotlib picks the format from the suffix, and takes a name without one, or a
folder, as a name to which it appends `.png`, so the file written is not the one named."""

from __future__ import annotations

import argparse
from pathlib import Path

# Formats matplotlib's own backends write (no LaTeX, no optional image codec).
IMAGE_SUFFIXES = (".png", ".svg", ".svgz", ".pdf", ".jpg", ".jpeg", ".tif", ".tiff", ".webp", ".eps", ".ps")


def image_file(text: str) -> Path:
    """An argparse type: `text` as the path of the image to write."""
    path = Path(text).expanduser()
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{text!r} is a folder; name the image file (e.g. {Path(text) / 'plot.png'})")
    if path.suffix.lower() not in IMAGE_SUFFIXES:
        raise argparse.ArgumentTypeError(
            f"{text!r}: the suffix picks the image format; expected one of {', '.join(IMAGE_SUFFIXES)}"
        )
    return path
