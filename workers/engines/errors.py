"""Errors an engine raises at the worker; each carries a stable code."""

from __future__ import annotations

from schemas.errors import SluicegateError


class EngineError(SluicegateError):
    code = "engine_error"


class EngineNotRunning(EngineError):
    """A generation was started before ``start()`` or after ``close()``."""

    code = "engine_not_running"
    status = 503
    retriable = True


class EngineUnavailable(EngineError):
    """The engine (a remote server) cannot be reached or answered with a server error."""

    code = "engine_unavailable"
    status = 503
    retriable = True


class DuplicateRequest(EngineError):
    """A generation was started with the id of one that is still running."""

    code = "duplicate_request"
    status = 409


class RequestTooLarge(EngineError):
    """The prompt and its output cannot fit in the whole KV cache (or the model's context)."""

    code = "request_too_large"
    status = 422


class UnsupportedParameter(EngineError):
    """The job asks for a sampling parameter (or a value of one) this engine cannot apply;
    it is refused rather than run without it."""

    code = "unsupported_parameter"
    status = 422


class EngineAborted(EngineError):
    """The engine ended the request itself before its output did (vLLM's ``finish_reason``
    "abort": the server was paused, put to sleep, or told to abort it)."""

    code = "engine_aborted"
    status = 503
    retriable = True
