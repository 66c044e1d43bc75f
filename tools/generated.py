"""The command line every docs generator shares: print the document, ``--write`` it, or
``--check`` that the committed file is what the code makes now (exit 1 if not)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path


def main(
    argv: list[str] | None,
    *,
    module: str,
    doc: Path,
    description: str | None,
    render: Callable[[], str],
) -> int:
    parser = argparse.ArgumentParser(prog=f"python -m {module}", description=description)
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--write", action="store_true", help=f"write {doc}")
    group.add_argument("--check", action="store_true", help=f"exit 1 if {doc} is stale")
    args = parser.parse_args(argv)
    text = render()
    if args.write:
        doc.write_text(text, encoding="utf-8")
    elif args.check:
        if not doc.exists() or doc.read_text(encoding="utf-8") != text:
            print(f"{doc} is stale: run python -m {module} --write", file=sys.stderr)
            return 1
    else:
        sys.stdout.write(text)
    return 0
