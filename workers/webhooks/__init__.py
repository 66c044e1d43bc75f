"""Webhook delivery: the faust app, the delivery loop, the SSRF-safe POST, signing, retry
policy and its SQL.
"""
