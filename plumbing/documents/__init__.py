"""Documents as people keep them, read into text: PDF, Word (.docx), HTML, Markdown,
reStructuredText and plain text. Pure functions of the file's bytes (no network, no files),
shared by ``sluicegate summarize`` and ``POST /v1/documents``; a file that cannot be read is
an ``UnreadableDocument`` with a stable code (docs/documents.md).

``plumbing.documents.extract`` is the entry point. This package imports no parser until a
document of its kind is read, so the settings (``plumbing.documents.limits``) stay light."""
