"""Sluicegate's own extractive summarizer: pure, deterministic, standard library only.

A document is split into sentences, each sentence is scored, and the best sentences are
kept, in their original order, until the token budget is spent:

- score: the normalized document frequency of the sentence's content words (words that are
  not stop words), summed and divided by the square root of their number, so that a sentence
  is rewarded for carrying the document's main terms without long sentences winning by size;
- position: the first sentences get a bonus that fades out over the lead of the document;
- length: very short (fragments) and very long sentences are penalized, and so are units
  without a final punctuation mark (headings, titles, list items).

Sentences are then taken best first while they fit in the budget; once the best one is in,
only sentences scoring at least ``MIN_RELATIVE_SCORE`` of it are added, so that leftover
budget is not filled with fragments.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Callable, Sequence

from workers.engines.sim.tokens import count_tokens

TokenCounter = Callable[[str], int]

POSITION_BONUS = 0.3
"""The first sentence's score is multiplied by 1 + POSITION_BONUS; the bonus fades linearly."""
LEAD_FRACTION = 0.2
"""The bonus fades out over this fraction of the sentences (over at least MIN_LEAD)."""
MIN_LEAD = 3
SHORT_WORDS = 6
"""Sentences with fewer words are scaled by (words / SHORT_WORDS) squared."""
LONG_WORDS = 40
"""Sentences with more words are scaled by LONG_WORDS / words."""
UNTERMINATED_FACTOR = 0.3
"""Scale for a sentence that does not end in . ! ? or … (a heading, a title, a list item)."""
MIN_RELATIVE_SCORE = 0.25
"""After the best sentence, only sentences scoring at least this fraction of it are added."""

# Abbreviations after which a period does not end a sentence, even before a capital letter
# (lower case, without their final period). Others ("etc.", "Inc.") end a sentence when the
# next word is capitalized, and never do when it is not.
ABBREVIATIONS = frozenset(
    {
        "mr", "mrs", "ms", "mx", "dr", "prof", "sr", "jr", "st", "mt", "ft", "rev", "hon",
        "gen", "col", "capt", "lt", "sgt", "gov", "sen", "rep", "pres", "supt", "insp",
        "vs", "e.g", "i.e", "cf", "viz", "al", "approx", "fig", "figs", "eq", "vol", "pp",
        "ca", "nos", "dept", "est", "jan", "feb", "mar", "apr", "jun", "jul", "aug", "sep",
        "sept", "oct", "nov", "dec",
    }
)  # fmt: skip

# Function words that say little about what a document is about.
STOP_WORDS = frozenset(
    {
        "a", "about", "above", "after", "again", "against", "all", "almost", "also", "although",
        "always", "am", "among", "an", "and", "another", "any", "anyone", "anything", "are",
        "around", "as", "at", "be", "because", "been", "before", "being", "below", "between",
        "both", "but", "by", "can", "cannot", "could", "did", "do", "does", "doing", "done",
        "down", "during", "each", "either", "else", "enough", "even", "ever", "every", "few",
        "for", "from", "further", "get", "gets", "getting", "got", "had", "has", "have", "having",
        "he", "her", "here", "hers", "herself", "him", "himself", "his", "how", "however", "i",
        "if", "in", "into", "is", "it", "its", "itself", "just", "least", "less", "let", "like",
        "made", "make", "makes", "many", "may", "me", "might", "more", "most", "much", "must",
        "my", "myself", "near", "need", "never", "no", "nor", "not", "now", "of", "off", "often",
        "on", "once", "one", "only", "onto", "or", "other", "others", "our", "ours", "ourselves",
        "out", "over", "own", "per", "perhaps", "put", "rather", "really", "same", "say", "said",
        "says", "see", "seen", "shall", "she", "should", "since", "so", "some", "something",
        "still", "such", "than", "that", "the", "their", "theirs", "them", "themselves", "then",
        "there", "these", "they", "this", "those", "though", "through", "thus", "to", "too",
        "toward", "towards", "under", "until", "up", "upon", "us", "use", "used", "using", "very",
        "via", "was", "we", "well", "were", "what", "whatever", "when", "where", "whether",
        "which", "while", "who", "whom", "whose", "why", "will", "with", "within", "without",
        "would", "yes", "yet", "you", "your", "yours", "yourself", "yourselves"
    }
)  # fmt: skip

_TERMINALS = (".", "!", "?", "…")
_CLOSERS = "\"'\u201d\u2019)]"
_PARAGRAPH_BREAK = re.compile(r"\n[ \t\r\f\v]*\n\s*")
_LIST_ITEM = re.compile(r"(?:[-*\u2022\u2013]|\d{1,3}[.)]|[a-zA-Z][.)])\s")
_WHITESPACE = re.compile(r"\s+")
# A run of terminal punctuation, any closing quotes or brackets, then whitespace.
_CANDIDATE_END = re.compile(r"[.!?\u2026]+[\"'\u201d\u2019)\]]*(?=\s)")
_WORD_BEFORE = re.compile(r"([\w.]+)\.$")
_CONTENT_WORD = re.compile(r"[^\W\d_]+(?:['\u2019][^\W\d_]+)*")


def split_sentences(text: str) -> list[str]:
    """The sentences of ``text``, in order, each with its whitespace collapsed to one space.

    Paragraphs (separated by a blank line) and list items (lines starting with a bullet or a
    number) always end a sentence; other line breaks are read as spaces, so wrapped prose
    reads as one sentence. Within a unit, a sentence ends at ``.``, ``!``, ``?`` or ``…``
    (with any closing quotes or brackets) followed by whitespace, except after an abbreviation
    such as "e.g." or "Dr.", after a single initial ("J. Smith"), and before a word starting
    in lower case. Decimals ("3.14") and versions ("v2.1.0") never end a sentence.
    """
    sentences: list[str] = []
    for unit in _units(text):
        sentences.extend(_split_unit(unit))
    return sentences


def _units(text: str) -> list[str]:
    """Paragraphs and list items, whitespace collapsed: the blocks a sentence never crosses."""
    units: list[str] = []
    for paragraph in _PARAGRAPH_BREAK.split(text):
        current: list[str] = []
        for line in paragraph.splitlines():
            stripped = line.strip()
            if not stripped:
                continue
            if current and _LIST_ITEM.match(stripped):
                units.append(" ".join(current))
                current = []
            current.append(stripped)
        if current:
            units.append(" ".join(current))
    return [_WHITESPACE.sub(" ", unit) for unit in units]


def _split_unit(unit: str) -> list[str]:
    sentences: list[str] = []
    start = 0
    for match in _CANDIDATE_END.finditer(unit):
        if _ends_sentence(unit, match.start(), match.end()):
            sentences.append(unit[start : match.end()])
            start = match.end() + 1  # the single space after it
    rest = unit[start:]
    if rest:
        sentences.append(rest)
    return sentences


def _ends_sentence(unit: str, end_start: int, end_stop: int) -> bool:
    following = unit[end_stop + 1 : end_stop + 2]
    if not following or following.islower() or following.isdigit() or following in ",;:":
        return False
    punctuation = unit[end_start:end_stop].rstrip(_CLOSERS)
    if punctuation != ".":
        return True  # "!", "?", "…", "?!" or "..."
    before = _WORD_BEFORE.search(unit[: end_start + 1])
    if before is None:
        return True
    word = before.group(1).lower()
    if word in ABBREVIATIONS:
        return False
    # A single initial ("J. Smith") does not end a sentence. A dotted acronym ("U.S.") before
    # a capital letter does: it ends a sentence more often than it starts a proper name.
    return not (len(word) == 1 and word.isalpha())


def content_words(sentence: str) -> list[str]:
    """The sentence's lower-cased words that are neither stop words nor shorter than 3 letters."""
    words = (word.lower() for word in _CONTENT_WORD.findall(sentence))
    return [word for word in words if len(word) > 2 and word not in STOP_WORDS]


def score_sentences(sentences: Sequence[str]) -> list[float]:
    """One score per sentence; higher is more representative of the whole document."""
    per_sentence = [content_words(sentence) for sentence in sentences]
    frequency = Counter(word for words in per_sentence for word in words)
    top = max(frequency.values(), default=0)
    lead = max(MIN_LEAD, math.ceil(LEAD_FRACTION * len(sentences)))
    scores: list[float] = []
    for index, (sentence, words) in enumerate(zip(sentences, per_sentence, strict=True)):
        if not words:
            scores.append(0.0)
            continue
        relevance = sum(frequency[word] / top for word in words) / math.sqrt(len(words))
        position = 1.0 + POSITION_BONUS * max(0.0, 1.0 - index / lead)
        scores.append(relevance * position * _shape_factor(sentence))
    return scores


def _shape_factor(sentence: str) -> float:
    words = len(sentence.split())
    factor = 1.0
    if words < SHORT_WORDS:
        factor = (words / SHORT_WORDS) ** 2
    elif words > LONG_WORDS:
        factor = LONG_WORDS / words
    if not sentence.rstrip(_CLOSERS).endswith(_TERMINALS):
        factor *= UNTERMINATED_FACTOR
    return factor


def select_sentences(
    sentences: Sequence[str],
    scores: Sequence[float],
    *,
    max_tokens: int,
    count: TokenCounter = count_tokens,
) -> list[int]:
    """Indexes of the sentences to keep, ascending.

    Sentences are taken best first (ties: the earlier one) while they fit in what is left of
    ``max_tokens``; one that does not fit is skipped, and none scoring under
    ``MIN_RELATIVE_SCORE`` of the best is taken. The best sentence is always kept, even when
    it alone exceeds the budget, so a non-empty document never has an empty summary.
    """
    if not sentences:
        return []
    ranked = sorted(range(len(sentences)), key=lambda i: (-scores[i], i))
    chosen = [ranked[0]]
    left = max_tokens - count(sentences[ranked[0]])
    for index in ranked[1:]:
        if left <= 0:
            break
        if scores[index] <= 0.0 or scores[index] < MIN_RELATIVE_SCORE * scores[ranked[0]]:
            break  # the rest are fragments or say little about the document
        cost = count(sentences[index])
        if cost <= left:
            chosen.append(index)
            left -= cost
    return sorted(chosen)


def summarize(text: str, *, max_tokens: int, count: TokenCounter = count_tokens) -> str:
    """An extractive summary of ``text``: its best sentences, in order, joined by spaces.

    With the default counter the summary is at most ``max_tokens`` tokens long unless its
    single best sentence is longer; callers that need a hard limit truncate (the simulator
    engine does). Empty or blank text gives an empty summary.
    """
    sentences = split_sentences(text)
    chosen = select_sentences(
        sentences, score_sentences(sentences), max_tokens=max_tokens, count=count
    )
    return " ".join(sentences[i] for i in chosen)
