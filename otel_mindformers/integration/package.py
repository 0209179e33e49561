"""What the instrumentor instruments: the MindSpore releases it is tested on
(compat/releases.py, scripts/matrix.sh); kept equal to the `instruments` extra in pyproject.toml."""

_instruments = ("mindspore >= 2.7.0, < 2.11",)
