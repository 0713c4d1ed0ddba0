"""The sidecar agent: scheduler and loops, history store (SQLite), Prometheus exporter, read-only HTTP
API, client of that API, and captures of deep evidence triggered by findings (docs/agent.md)."""
