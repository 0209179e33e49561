"""The non-finite feature's offline reader: the first bad rank (analysis layer)."""
