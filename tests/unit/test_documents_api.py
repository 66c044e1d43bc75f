"""The API's document reader (producers/api/documents.py): reads in threads, at most so many
at once, and refuses one more at once instead of queueing it."""

from __future__ import annotations

import asyncio
import threading

import pytest

from plumbing.documents.errors import UnreadableDocument
from plumbing.documents.limits import DocumentLimits
from plumbing.settings import Settings
from producers.api.app import create_app
from producers.api.documents import DocumentsBusy, Extractor
from tests.support import documents as make


class HeldRead:
    """A read that holds its thread until ``release`` is set."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.started = threading.Event()

    def __call__(self, data: bytes, name: str, limits: DocumentLimits) -> str:
        self.started.set()
        assert self.release.wait(30)
        return data.decode()


async def test_one_read_too_many_is_refused_at_once() -> None:
    read = HeldRead()
    extractor = Extractor(DocumentLimits(), at_once=2, read=read)
    first = asyncio.create_task(extractor.text(b"first", "a.txt"))
    second = asyncio.create_task(extractor.text(b"second", "b.txt"))
    await asyncio.sleep(0)  # both have taken their places
    with pytest.raises(DocumentsBusy) as refused:
        await extractor.text(b"third", "c.txt")
    assert (refused.value.code, refused.value.status, refused.value.retriable) == (
        "documents_busy",
        503,
        True,
    )
    read.release.set()
    assert await asyncio.gather(first, second) == ["first", "second"]
    assert await extractor.text(b"third", "c.txt") == "third"


async def test_a_read_whose_request_went_away_keeps_its_place_till_its_thread_ends() -> None:
    read = HeldRead()
    extractor = Extractor(DocumentLimits(), at_once=1, read=read)
    gone = asyncio.create_task(extractor.text(b"gone", "a.txt"))
    await asyncio.to_thread(read.started.wait, 30)
    gone.cancel()
    with pytest.raises(asyncio.CancelledError):
        await gone
    with pytest.raises(DocumentsBusy):  # its thread is still reading
        await extractor.text(b"next", "b.txt")
    read.release.set()
    async with asyncio.timeout(30):
        while True:
            try:
                assert await extractor.text(b"next", "b.txt") == "next"
                break
            except DocumentsBusy:
                await asyncio.sleep(0.01)


async def test_the_api_s_reader_reads_under_the_settings() -> None:
    extractor = Extractor.of(Settings.model_construct())
    assert extractor.limits == DocumentLimits(max_text_bytes=4 * 1_048_576)
    assert (await extractor.text(make.pdf_bytes(2), "a.pdf")).startswith("Chapter 1: the gate")
    with pytest.raises(UnreadableDocument) as refused:
        await extractor.text(b"%PDF-1.7\n junk", "a.pdf")
    assert refused.value.code == "corrupt_file"


def test_the_route_is_in_the_openapi_document_as_a_multipart_upload() -> None:
    document = create_app(Settings.model_construct()).openapi()
    operation = document["paths"]["/v1/documents"]["post"]
    assert set(operation["requestBody"]["content"]) == {"multipart/form-data"}
    assert {"202", "200", "413", "415", "422", "503"} <= set(operation["responses"])
