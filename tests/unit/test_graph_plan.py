"""How a long document is cut and how summaries are grouped: each chunk within its budget,
cut where the text is, sections kept together, the tail of one chunk opening the next; the
engine's own count decides, and a max_tokens that leaves no room to combine is refused."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta

import pytest

from schemas.jobs import JobKind, fan_in, reduce_levels, shape
from tests.support.long_text import long_document
from workers.engines.base import GenerationRequest
from workers.engines.sim.engine import SimEngine
from workers.engines.sim.tokens import count_tokens
from workers.graph.ids import new_id, partition_of
from workers.graph.plan import SEPARATOR, blocks, group, is_heading, pack, sentences, units
from workers.graph.splitter import CannotSplit, Splitter
from workers.repository import ClaimedJob

NOW = datetime(2026, 11, 28, 12, tzinfo=UTC)


def test_a_document_is_cut_on_its_paragraphs_within_the_budget() -> None:
    text = long_document(3000)
    chunks = pack(units(text, 300, count_tokens), 300, count_tokens)
    assert len(chunks) > 5
    assert all(count_tokens(c) <= 300 for c in chunks)
    # Whole paragraphs, in order, nothing lost or made up.
    assert SEPARATOR.join(chunks).split(SEPARATOR) == blocks(text)


def test_sections_stay_whole_and_chunks_fill() -> None:
    text = long_document(20_000)
    chunks = pack(units(text, 1600, count_tokens), 1600, count_tokens)
    for chunk in chunks:  # a chunk opens a section and ends where one does
        assert is_heading(chunk.split(SEPARATOR)[0])
        assert not is_heading(chunk.split(SEPARATOR)[-1])
    # Sections of about 360 tokens: four or so a chunk, not one chunk per section.
    assert sum(count_tokens(c) for c in chunks) / len(chunks) > 0.8 * 1600
    big = "## One long section\n\n" + "\n\n".join(
        " ".join(f"Sentence {i}.{j} of the section." for j in range(8)) for i in range(40)
    )
    cut = pack(units(big, 200, count_tokens), 200, count_tokens)
    assert len(cut) > 5
    assert all(count_tokens(c) <= 200 for c in cut)


def test_a_paragraph_over_the_budget_is_cut_into_sentences_then_words() -> None:
    paragraph = " ".join(f"Sentence number {i} says something short." for i in range(60))
    pieces = units(paragraph, 40, count_tokens)
    assert all(count_tokens(p) <= 40 for p in pieces)
    assert all(p.endswith(".") for p in pieces)  # whole sentences
    run_on = "word " * 500
    cut = units(run_on, 40, count_tokens)
    assert all(count_tokens(p) <= 40 for p in cut)
    assert " ".join(cut).split() == run_on.split()


def test_each_chunk_opens_with_the_last_sentences_of_the_one_before() -> None:
    text = long_document(3000)
    chunks = pack(units(text, 300, count_tokens), 300, count_tokens, overlap=40)
    assert all(count_tokens(c) <= 300 for c in chunks)
    mid_section = 0
    for before, after in itertools.pairwise(chunks):
        opening = after.split(SEPARATOR)[0]
        if is_heading(opening):
            continue  # a new section starts where the text does
        mid_section += 1
        last = sentences(before.split(SEPARATOR)[-1])[-1]
        assert opening.endswith(last), (before[-200:], opening)
        assert count_tokens(opening) <= 40
    assert mid_section >= 3


def test_summaries_are_grouped_evenly_within_the_budget_and_fan_in() -> None:
    runs = group([100] * 10, budget=1000, most=4)
    assert runs == [[0, 1, 2, 3], [4, 5, 6], [7, 8, 9]]  # evened out, in order
    tight = group([300] * 6, budget=700, most=10)
    assert all(sum(300 + 2 for _ in r) <= 700 for r in tight)
    assert len(tight) < 6  # a level always shrinks


def test_the_shape_of_a_graph_from_its_size() -> None:
    assert shape(1000, 100, 2048) is None  # fits whole
    graph = shape(20_000, 128, 2048)
    assert graph is not None
    budget = int((2048 - 128) * 0.95)
    assert graph.chunks == -(-20_000 // budget)
    assert graph.levels == 1 + reduce_levels(graph.chunks, fan_in(budget, 128))
    assert graph.jobs > graph.chunks
    assert shape(20_000, 1500, 2048) is None  # no room to combine: its worker refuses it
    assert fan_in(1000, 498) == 2
    assert fan_in(1000, 499) == 0
    assert reduce_levels(1, 4) == 0
    assert reduce_levels(4, 4) == 1
    assert reduce_levels(5, 4) == 2


def claimed(text: str, max_tokens: int = 40) -> ClaimedJob:
    return ClaimedJob(
        id="doc",
        tenant="t",
        kind=JobKind.SUMMARIZE,
        input=text,
        max_tokens=max_tokens,
        deadline=NOW + timedelta(minutes=30),
        created_at=NOW,
        attempt=1,
        callback_url=None,
        prompt_tokens=count_tokens(text),
    )


async def test_the_engine_measures_every_chunk_and_each_fits_its_context() -> None:
    engine = SimEngine(time_scale=0, max_model_len=512)
    splitter = Splitter(engine)
    assert await splitter.split(claimed("A short note."), NOW) is None
    split = await splitter.split(claimed(long_document(2500)), NOW)
    assert split is not None
    plan = split.plan
    assert len(plan.chunks) >= 6
    for chunk in plan.chunks:
        request = GenerationRequest(
            request_id="m", kind=JobKind.SUMMARIZE, input=chunk, max_tokens=40
        )
        assert await engine.prompt_tokens(request) + 40 <= 512
    # A third of the 30 minutes is kept for the reduces, shared by their levels.
    assert split.level_s == pytest.approx(1800 * 0.3 / (plan.levels - 1))
    measured = await splitter.split(claimed(long_document(2500)), NOW, service_s=4.0)
    assert measured is not None
    assert measured.level_s == 12.0


async def test_a_max_tokens_that_leaves_no_room_to_combine_is_refused() -> None:
    splitter = Splitter(SimEngine(time_scale=0, max_model_len=512))
    with pytest.raises(CannotSplit, match="ask for at most"):
        await splitter.split(claimed(long_document(2500), max_tokens=300), NOW)


def test_a_levels_parts_are_drawn_onto_the_partitions_in_turn() -> None:
    # The producer's own partitioner (murmur2 of the key) decides: 138 parts on 16
    # partitions, 8 or 9 each, where ids left to chance fell 16 to 4.
    placed = [partition_of(new_id(3 + seq, 16), 16) for seq in range(138)]
    assert placed == [(3 + seq) % 16 for seq in range(138)]
    assert new_id() != new_id()
    assert partition_of(new_id(5, 1), 1) == 0
