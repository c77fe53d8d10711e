"""`python -m edge_agent`: the same as the `edge-agent` command."""

from edge_agent.cli.launch import entry

entry()
