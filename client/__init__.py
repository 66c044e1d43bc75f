"""The client side: the Python client of the HTTP API (``client.api.AsyncClient``, with
retries that honour Retry-After; ``client.sync.Client``, the same blocking, for threads),
the ``summarize`` command's work (``client.summarize``), the demo's console
(``client.demo``) and its bundled sample documents (``client.samples``). It talks to the
API over HTTP only: it imports ``schemas`` and the plumbing, never the producers or the
workers."""
