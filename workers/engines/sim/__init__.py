"""The simulator engine: paged KV blocks, continuous batching and roofline step times
(``engine.py``), what it decodes, and the same engine behind an OpenAI-compatible server
with vLLM's metrics (``server.py``).
"""
