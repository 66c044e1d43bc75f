"""One root error type; each error carries a stable code and says if it is retriable."""

from __future__ import annotations


class SluicegateError(Exception):
    code: str = "internal_error"
    status: int = 500
    retriable: bool = False

    def __init__(self, message: str, *, details: object | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.details = details


class InvalidRequest(SluicegateError):
    code = "invalid_request"
    status = 422


class InvalidJson(SluicegateError):
    code = "invalid_json"
    status = 400


class PayloadTooLarge(SluicegateError):
    code = "payload_too_large"
    status = 413


class JobNotFound(SluicegateError):
    code = "job_not_found"
    status = 404


class JobAlreadyTerminal(SluicegateError):
    code = "job_terminal"
    status = 409


class IdempotencyConflict(SluicegateError):
    code = "idempotency_key_reused"
    status = 409


class Unavailable(SluicegateError):
    code = "unavailable"
    status = 503
    retriable = True


class PoisonRecord(SluicegateError):
    """A record on a topic that cannot be decoded; it is dead-lettered, never retried."""

    code = "poison_record"


class Unauthorized(SluicegateError):
    code = "unauthorized"
    status = 401


class BatchNotFound(SluicegateError):
    code = "batch_not_found"
    status = 404
