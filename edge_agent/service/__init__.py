"""Running as a systemd service: readiness, watchdog and status over sd_notify."""
