"""Fixed-memory latency histograms, FPS and drop counters: what telemetry publishes."""
