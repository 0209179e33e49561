"""The stragglers feature's offline reader: `report`'s bottleneck verdict (analysis layer)."""
