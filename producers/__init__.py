"""The ingress side: HTTP API, admission, outbox relay, submit client."""
