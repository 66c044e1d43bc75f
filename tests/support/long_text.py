"""A long document made by code, for the tests of long documents: the benchmarks' generator
(``benchmarks/lib/long_text.py``), one text for a seed wherever it is made."""

from __future__ import annotations

from benchmarks.lib.long_text import long_document, sentence

__all__ = ["long_document", "sentence"]
