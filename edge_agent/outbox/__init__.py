"""A durable, bounded store-and-forward queue for everything the agent publishes."""

from edge_agent.outbox.outbox import Outbox, OutboxStats, Priority, Queued

__all__ = ["Outbox", "OutboxStats", "Priority", "Queued"]
