"""Who this process is in the training job (identity.py: rank, world, device, node, launcher),
and what the job is (layout.py: its parallel layout; versions.py: its software)."""
