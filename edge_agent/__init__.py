"""edge-agent: inference runtime and fleet agent for Intel edge boxes."""

__version__ = "0.1.0"
