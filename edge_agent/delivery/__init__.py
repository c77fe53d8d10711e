"""Signed releases pulled in chunks over MQTT (paced broadcast + per-device repair) or URLs."""
