"""`python -m edge_agent`: the same as the `edge-agent` command."""

from edge_agent.cli.main import entry

entry()
