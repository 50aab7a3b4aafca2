"""HTTP: OpenAI-compatible endpoints, the admin API, Prometheus /metrics and OpenAPI."""
