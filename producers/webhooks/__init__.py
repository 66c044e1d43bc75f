"""The webhook API: delivery history and signing secrets."""
