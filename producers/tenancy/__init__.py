"""Tenants and their API keys: the keys' form (``keys``) and their SQL (``repository``)."""
