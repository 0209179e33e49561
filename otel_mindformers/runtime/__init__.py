"""The monitored run itself: `MonitorCallback` (the MindSpore hooks and the hot path), `MonitorRun`
(one run's subsystems), the sampling cadence, the sampled-step readback and pipeline, and custom
monitors."""
