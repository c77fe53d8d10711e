"""Integrations users already know, all opt-in: Home Assistant, Prometheus, journald.

Each is a module that turns what the agent already has (its telemetry, its
events, its log records) into another system's format; `hub.Integrations` is
the one object the service holds and calls from the places it already publishes.
"""
