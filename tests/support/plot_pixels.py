"""Reading an `otel-mindformers plot` image back: its pixels, its panels, and a curve's colour."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from matplotlib.colors import to_rgb
from PIL import Image

from otel_mindformers.analysis.plot import PANELS


def load(path: Path) -> np.ndarray:
    with Image.open(path) as image:
        return np.asarray(image.convert("RGB")).astype(int)


def panels(pixels: np.ndarray) -> dict[str, np.ndarray]:
    """The 2x2 grid below the title and legend strip, keyed by metric in PANELS order."""
    height, width, _ = pixels.shape
    top, middle, centre = int(height * 0.1), int(height * 0.53), width // 2
    regions = (
        pixels[top:middle, :centre],
        pixels[top:middle, centre:],
        pixels[middle:, :centre],
        pixels[middle:, centre:],
    )
    return {metric: region for (metric, _, _), region in zip(PANELS, regions)}


def _of_color(region: np.ndarray, color: str, tolerance: int) -> np.ndarray:
    rgb = np.array([round(c * 255) for c in to_rgb(color)])
    return np.abs(region - rgb).max(axis=2) <= tolerance


def count(region: np.ndarray, color: str, tolerance: int = 20) -> int:
    """How many pixels of `region` are `color`."""
    return int(_of_color(region, color, tolerance).sum())


def spread(region: np.ndarray, color: str, tolerance: int = 20) -> float:
    """Interquartile range of the rows holding `color`: how much of the height a curve covers."""
    rows = np.nonzero(_of_color(region, color, tolerance))[0]
    assert rows.size > 100, f"{color} is hardly drawn"
    q1, q3 = np.percentile(rows, [25, 75])
    return float(q3 - q1)
