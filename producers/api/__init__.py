"""The HTTP API: an app factory that only wires, and one router per resource."""
