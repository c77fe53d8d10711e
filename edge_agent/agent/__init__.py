"""The agent: command handlers, the supervisor of pipelines and jobs, and the service."""
