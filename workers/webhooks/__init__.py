"""Webhook delivery: the process (``process.py``), its faust app (``app.py``) and event
handler (``events.py``), the delivery loop (``dispatch.py``), the SSRF-safe POST, signing,
retry policy, and its SQL (``delivery_repository.py``, ``attempt_repository.py``).
"""
