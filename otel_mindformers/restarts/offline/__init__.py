"""The restarts feature's offline readers: `report`'s job section and `plot --attempts`
(analysis layer: no live module imports these)."""
