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
    """The body or a parameter is not valid; ``details`` says where."""

    code = "invalid_request"
    status = 422


class InvalidJson(SluicegateError):
    """The body is not valid JSON (or not UTF-8, or nested too deeply)."""

    code = "invalid_json"
    status = 400


class PayloadTooLarge(SluicegateError):
    """The request is over a size limit."""

    code = "payload_too_large"
    status = 413


class JobNotFound(SluicegateError):
    """No such job for this tenant (another tenant's job answers this too)."""

    code = "job_not_found"
    status = 404


class JobAlreadyTerminal(SluicegateError):
    """The job has already ended: it cannot be cancelled or renewed."""

    code = "job_terminal"
    status = 409


class JobOfDocument(SluicegateError):
    """The job is a part of a document's graph: it ends with its document, which is the
    one to cancel."""

    code = "job_of_document"
    status = 409


class IdempotencyConflict(SluicegateError):
    """The Idempotency-Key was already used with a different request."""

    code = "idempotency_key_reused"
    status = 409


class Unauthorized(SluicegateError):
    """No ``Authorization: Bearer`` key, or an unknown or revoked one."""

    code = "unauthorized"
    status = 401


class OperatorOnly(SluicegateError):
    """The request needs an operator key (``sluicegate keys create TENANT --operator``):
    a plain key sees only its own tenant."""

    code = "operator_only"
    status = 403


class BatchNotFound(SluicegateError):
    """No such batch for this tenant."""

    code = "batch_not_found"
    status = 404
