"""vLLM engines: a ``vllm serve`` server over HTTP (``http.py``) and the in-process
``AsyncLLM`` (``local.py``), with its KV and speed figures (``stats.py``).
"""
