"""The model store: signed releases (release.py), verified, content-addressed versions
with atomic activation behind a health gate (store.py, health.py)."""
