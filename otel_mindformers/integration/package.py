"""What the instrumentor instruments; kept equal to the `instruments` extra in pyproject.toml."""

_instruments = ("mindspore >= 2.3",)
