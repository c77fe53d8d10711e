"""The agent's configuration file."""
