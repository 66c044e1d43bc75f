"""The web page at /ui: server-rendered pages (Jinja2 templates, htmx) over the same
repositories as the JSON API, behind the same API keys."""
