"""The orchestrator process: admission by key, heartbeats, work assignment,
signed upload URLs, the ledger of contributions and stakes (see app.py)."""
