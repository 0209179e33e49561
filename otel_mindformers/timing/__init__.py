"""Where a run's wall time goes: phases (`phase()` and the built-in ones), the training thread's
timeline, the worker's accounting of each sampled window, the time ledger (goodput) and
efficiency (MFU, TFLOPS, ETA)."""
