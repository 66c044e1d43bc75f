"""Real document files, made by code (never downloaded): PDFs with and without a text
layer, encrypted and damaged ones, Word files and a zip bomb named .docx, a web page with
navigation and footer around its article, Markdown, reStructuredText, text in odd encodings,
and the folder of issue 44's check (``sample_folder``).

Every builder writes ``path`` and returns it. The prose is made from sentence templates with
a seeded random generator: the same bytes on every run."""

from __future__ import annotations

import io
import random
import zipfile
from pathlib import Path

import docx
from fpdf import FPDF
from PIL import Image, ImageDraw
from pypdf import PdfReader, PdfWriter

# Words that are in the navigation, header, cookie banner, script and footer of
# ``web_page``, and must never be in its text.
NAVMENU_TOKEN = "NAVMENU-TOKEN"
HEADER_TOKEN = "HEADER-TOKEN"
FOOTER_TOKEN = "FOOTER-TOKEN"
COOKIE_TOKEN = "COOKIE-TOKEN"
SCRIPT_TOKEN = "SCRIPT-TOKEN"
BOILERPLATE_TOKENS = (NAVMENU_TOKEN, HEADER_TOKEN, FOOTER_TOKEN, COOKIE_TOKEN, SCRIPT_TOKEN)
# What ``web_page``'s article says: its heading, and a phrase of each paragraph.
ARTICLE_HEADING = "How the river gate is kept"
ARTICLE_PHRASES = (
    "The gate on the old mill race was built in 1820",
    "Water rises behind the gate until the keeper opens it",
    "In winter the gate is closed to spare the wheel",
)
PDF_PASSWORD = "sluice"
MIB = 1_048_576

_SUBJECTS = (
    "The keeper",
    "The council",
    "A survey team",
    "The engineer on duty",
    "The mill's owner",
    "Each apprentice",
    "The harbour master",
    "A visiting inspector",
    "The village archivist",
    "The lock crew",
)
_VERBS = (
    "records",
    "checks",
    "reports",
    "questions",
    "measures",
    "explains",
    "compares",
    "reviews",
    "repairs",
    "describes",
)
_OBJECTS = (
    "the water level at the upper sluice",
    "the wear on the oak paddles",
    "the flow through the side channel",
    "the cost of the spring repairs",
    "the silt that gathers below the weir",
    "the schedule of the barges",
    "the ledger kept since the flood of 1953",
    "the strength of the new iron hinges",
    "the rainfall of the previous month",
    "the lease of the eastern meadow",
)
_CLAUSES = (
    "before the first barge of the morning arrives",
    "because the spring floods came early this year",
    "while the wheel is stopped for maintenance",
    "so that the farmers downstream can plan their irrigation",
    "although the old records disagree on the figures",
    "after a week of unusually heavy rain",
    "as the regulations of the river authority require",
    "when the fish ladder is opened for the season",
    "once the meadows have been drained",
    "unless the council decides otherwise at its next meeting",
)
_TOPICS = (
    "Water levels",
    "Repairs and maintenance",
    "Costs and budgets",
    "Navigation",
    "Floods and records",
    "The people of the mill",
    "Fish and wildlife",
    "Agreements with the farmers",
)


def sentence(rng: random.Random) -> str:
    return (
        f"{rng.choice(_SUBJECTS)} {rng.choice(_VERBS)} {rng.choice(_OBJECTS)} "
        f"{rng.choice(_CLAUSES)}."
    )


def paragraph(rng: random.Random, sentences: int = 5) -> str:
    return " ".join(sentence(rng) for _ in range(sentences))


def prose(size_bytes: int = 80_000, *, seed: int = 44) -> str:
    """English prose of about ``size_bytes`` (80 KB: about 20,000 tokens), in sections under
    Markdown headings, paragraphs apart by blank lines; the same text for the same seed."""
    rng = random.Random(seed)
    blocks: list[str] = ["# The river gate: a year of records"]
    size = len(blocks[0])
    section = 0
    while size < size_bytes:
        section += 1
        heading = f"## {section}. {_TOPICS[(section - 1) % len(_TOPICS)]}"
        blocks.append(heading)
        size += len(heading) + 2
        for _ in range(rng.randint(3, 6)):
            text = paragraph(rng, rng.randint(4, 8))
            blocks.append(text)
            size += len(text) + 2
    return "\n\n".join(blocks) + "\n"


def long_text(path: Path, size_bytes: int = 80_000) -> Path:
    path.write_text(prose(size_bytes), encoding="utf-8")
    return path


def pdf_bytes(pages: int = 3, *, seed: int = 7) -> bytes:
    """A PDF with a text layer: on each page a heading ("Chapter N") and two paragraphs."""
    rng = random.Random(seed)
    pdf = FPDF()
    for number in range(1, pages + 1):
        pdf.add_page()
        pdf.set_font("helvetica", "B", 16)
        pdf.multi_cell(0, 10, f"Chapter {number}: the gate", new_x="LMARGIN", new_y="NEXT")
        pdf.set_font("helvetica", size=11)
        for _ in range(2):
            pdf.multi_cell(0, 6, paragraph(rng), new_x="LMARGIN", new_y="NEXT")
            pdf.ln(4)
    return bytes(pdf.output())


def text_pdf(path: Path, pages: int = 3) -> Path:
    path.write_bytes(pdf_bytes(pages))
    return path


def encrypted_pdf(path: Path) -> Path:
    """A PDF with a text layer that opens only with ``PDF_PASSWORD``."""
    writer = PdfWriter(clone_from=PdfReader(io.BytesIO(pdf_bytes(1))))
    writer.encrypt(PDF_PASSWORD, algorithm="RC4-128")
    out = io.BytesIO()
    writer.write(out)
    path.write_bytes(out.getvalue())
    return path


def scanned_pdf(path: Path, pages: int = 2) -> Path:
    """Pages that are only images (of lines, as a scanner makes them): no text layer."""
    pdf = FPDF()
    for _ in range(pages):
        image = Image.new("L", (600, 800), "white")
        draw = ImageDraw.Draw(image)
        for y in range(60, 760, 24):
            draw.line((50, y, 550, y), fill="black", width=3)
        pdf.add_page()
        pdf.image(image, x=10, y=10, w=190)
    path.write_bytes(bytes(pdf.output()))
    return path


def corrupt_pdf(path: Path) -> Path:
    """A PDF header, and then the middle of a text PDF: no object can be found."""
    good = pdf_bytes(2)
    path.write_bytes(b"%PDF-1.7\n" + good[len(good) // 3 : len(good) // 2])
    return path


def word_document(path: Path) -> Path:
    """A .docx with a title, headings of two levels, paragraphs, a list item and a table."""
    rng = random.Random(11)
    document = docx.Document()
    document.add_heading("Minutes of the gate committee", level=0)
    document.add_heading("Attendance", level=1)
    document.add_paragraph(paragraph(rng, 3))
    document.add_heading("The spring repairs", level=1)
    document.add_paragraph(paragraph(rng, 4))
    document.add_heading("Costs", level=2)
    document.add_paragraph(paragraph(rng, 4))
    document.add_paragraph("Order new hinges before May.", style="List Bullet")
    table = document.add_table(rows=2, cols=2)
    for (row, col), text in {(0, 0): "Item", (0, 1): "Cost", (1, 0): "Hinges"}.items():
        table.cell(row, col).text = text
    table.cell(1, 1).text = "420 pounds"
    document.add_paragraph("")  # an empty paragraph, as people leave them
    document.add_paragraph(paragraph(rng, 3))
    document.save(str(path))
    return path


def docx_zip_bomb(path: Path, unpacked_bytes: int = 256 * MIB) -> Path:
    """A zip named .docx whose document part unpacks to ``unpacked_bytes`` of zeros (256 MiB
    by default, twice the default limit) from well under a megabyte."""
    chunk = b"\0" * MIB
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("[Content_Types].xml", '<?xml version="1.0"?><Types/>')
        with archive.open("word/document.xml", "w", force_zip64=True) as part:
            for _ in range(unpacked_bytes // MIB):
                part.write(chunk)
    return path


WEB_PAGE = f"""<!DOCTYPE html>
<html lang="en">
<head>
  <meta charset="utf-8">
  <title>River gate | The Mill Society</title>
  <script>window.tracker = "{SCRIPT_TOKEN}";</script>
  <style>nav {{ float: left; }}</style>
</head>
<body>
  <header><div class="logo">The Mill Society {HEADER_TOKEN}</div></header>
  <nav class="menu">
    <ul>
      <li><a href="/">Home {NAVMENU_TOKEN}</a></li>
      <li><a href="/history">History</a></li>
      <li><a href="/events">Events</a></li>
      <li><a href="/contact">Contact</a></li>
    </ul>
  </nav>
  <div id="cookie-banner" class="cookie-consent">We use cookies {COOKIE_TOKEN}.
    <button>Accept all</button></div>
  <main>
    <article>
      <h1>{ARTICLE_HEADING}</h1>
      <p>{ARTICLE_PHRASES[0]} by the miller's family, and it still turns today when the
      river runs high in spring. Its oak paddles were replaced twice in two centuries.</p>
      <h2>Opening the gate</h2>
      <p>{ARTICLE_PHRASES[1]}, letting a measured flow through to the wheel. The keeper
      records every opening in a ledger that the village archivist keeps.</p>
      <p>{ARTICLE_PHRASES[2]} from the ice, and the race is drained so that repairs can be
      made to the stone channel before the first barges of the year.</p>
    </article>
  </main>
  <footer><p>Copyright 2024 The Mill Society {FOOTER_TOKEN}. All rights reserved.</p>
    <p><a href="/privacy">Privacy</a> | <a href="/terms">Terms</a></p></footer>
</body>
</html>
"""


def web_page(path: Path) -> Path:
    path.write_text(WEB_PAGE, encoding="utf-8")
    return path


MARKDOWN_NOTE = """# Note on the gate

The keeper asked for **new hinges** before the spring floods.

- Order them from the foundry.
- Check the paddles at the same time.
"""


def markdown_note(path: Path) -> Path:
    path.write_text(MARKDOWN_NOTE, encoding="utf-8")
    return path


RST_TEXT = """Gate procedures
===============

Opening
-------

The keeper opens the gate at dawn and writes the level in the ledger.

Closing
-------

The gate is closed at dusk, or at once when the river rises past the mark.
"""


def rst_file(path: Path) -> Path:
    path.write_text(RST_TEXT, encoding="utf-8")
    return path


def odd_text_files(folder: Path) -> dict[str, str]:
    """Text in the encodings people have: UTF-8 with a BOM, UTF-16 with its BOM (both
    byte orders), Latin-1 and UTF-16 without a BOM. The names, and each one's text."""
    texts = {
        "bom.txt": ("utf-8-sig", "Notes with a byte-order mark: café"),
        "notepad.txt": ("utf-16", "UTF-16 from Notepad: naïve"),
        "big-endian.text": ("utf-16-be", "\ufeffUTF-16, big end first: crème"),
        "latin1.txt": ("latin-1", "Café crème: notes from Lyon"),
        "wide.txt": ("utf-16-le", "UTF-16 without its BOM"),
    }
    folder.mkdir(parents=True, exist_ok=True)
    for name, (encoding, text) in texts.items():
        (folder / name).write_bytes(text.encode(encoding))
    return {name: text.removeprefix("\ufeff") for name, (_, text) in texts.items()}


def sample_folder(path: Path) -> list[str]:
    """The folder of issue 44's check: a long plain text (about 20,000 tokens), a PDF of
    several pages, a Word file, a web page with navigation and footer, and a short Markdown
    note. The names written."""
    path.mkdir(parents=True, exist_ok=True)
    written = [
        long_text(path / "river-gate-records.txt"),
        text_pdf(path / "annual-report.pdf", pages=4),
        word_document(path / "committee-minutes.docx"),
        web_page(path / "river-gate.html"),
        markdown_note(path / "note.md"),
    ]
    return sorted(p.name for p in written)
