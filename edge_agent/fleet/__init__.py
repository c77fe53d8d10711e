"""The fleet side: `edge-fleet` publish, serve and keygen; the release repository."""
