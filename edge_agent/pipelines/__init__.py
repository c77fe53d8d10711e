"""Pipelines: source -> inference -> head -> sinks, with stage timing and hot swap."""
