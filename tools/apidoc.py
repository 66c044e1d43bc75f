"""docs/api.md, generated from the app's OpenAPI document and the code's error codes, so that
it cannot drift from them.

    python -m tools.apidoc > docs/api.md
    python -m tools.apidoc --write     # the same
    python -m tools.apidoc --check     # exit 1 when docs/api.md is stale

Every word about an operation comes from the document (its summary, description, parameters,
bodies and responses: the route decorators and signatures say them). The error codes come
from where the code defines them: each ``SluicegateError`` class (its code, status and
docstring), the body-limit exceptions, the codes the exception handlers answer with
(``producers.api.errors.HANDLER_CODES``), the reasons a document cannot be read
(``plumbing.documents.errors.REASONS``) and the admission refusals
(``producers.admission.policy``).
"""

from __future__ import annotations

import importlib
import inspect
import json
import pkgutil
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from plumbing.documents.errors import REASONS as DOCUMENT_REASONS
from plumbing.settings import Settings
from producers.admission.limits import BodyTooLarge, RequestTimeout
from producers.admission.policy import REFUSALS, UNAVAILABLE, Refused
from producers.api import channel
from producers.api.app import create_app
from producers.api.errors import HANDLER_CODES
from schemas import reasons
from schemas.errors import SluicegateError
from tools import generated

DOC = Path(__file__).resolve().parents[1] / "docs" / "api.md"
METHODS = ("get", "post", "put", "patch", "delete")
# The rooms whose errors the API answers with (the workers' are never an HTTP answer).
ROOMS = ("schemas", "producers")
# Header parameters that say who the caller is: shown once, under Headers.
AUTH_HEADERS = ("authorization", "x-sluicegate-tenant")
_CONSTRAINTS = (
    ("minLength", "length ≥ {}"),
    ("maxLength", "length ≤ {}"),
    ("minItems", "≥ {} items"),
    ("maxItems", "≤ {} items"),
    ("minimum", "≥ {}"),
    ("ge", "≥ {}"),
    ("exclusiveMinimum", "> {}"),
    ("gt", "> {}"),
    ("maximum", "≤ {}"),
    ("le", "≤ {}"),
    ("exclusiveMaximum", "< {}"),
    ("lt", "< {}"),
)

Schema = dict[str, Any]


@dataclass
class ErrorCode:
    code: str
    statuses: set[int | None] = field(default_factory=set)
    meanings: list[str] = field(default_factory=list)
    sources: list[str] = field(default_factory=list)

    def add(self, status: int | None, meaning: str, source: str) -> None:
        self.statuses.add(status)
        if meaning not in self.meanings:
            self.meanings.append(meaning)
        self.sources.append(source)


def openapi_document() -> Schema:
    """The app's OpenAPI document (no setting changes it; no I/O happens)."""
    return create_app(Settings.model_construct()).openapi()


# The error codes, from the code.


def _subclasses(cls: type[SluicegateError]) -> Iterator[type[SluicegateError]]:
    for sub in cls.__subclasses__():
        yield sub
        yield from _subclasses(sub)


def _meaning(cls: type) -> str:
    """The first paragraph of the class's own docstring, else its name in words."""
    doc = cls.__dict__.get("__doc__")
    if doc:
        return _inline(inspect.cleandoc(doc).split("\n\n", 1)[0])
    words = re.sub(r"(?<!^)(?=[A-Z])", " ", cls.__name__).lower()
    return words[0].upper() + words[1:] + "."


def _source(cls: type) -> str:
    return f"`{cls.__module__}.{cls.__qualname__}`"


def error_codes() -> list[ErrorCode]:
    """Every error code an HTTP answer can carry, except the admission refusals: those of
    the rooms the API is made of (whatever else the process has imported)."""
    for room in ROOMS:
        package = importlib.import_module(room)
        for module in pkgutil.walk_packages(package.__path__, f"{room}."):
            importlib.import_module(module.name)
    found: dict[str, ErrorCode] = {}

    def add(code: str, status: int | None, meaning: str, source: str) -> None:
        found.setdefault(code, ErrorCode(code)).add(status, meaning, source)

    classes = sorted(set(_subclasses(SluicegateError)), key=lambda c: (c.__module__, c.__name__))
    for cls in classes:
        code = cls.__dict__.get("code")
        if cls.__module__.split(".")[0] not in ROOMS or issubclass(cls, Refused):
            continue
        if isinstance(code, str):
            add(code, cls.status, _meaning(cls), _source(cls))
    body_limits: list[BodyTooLarge | RequestTimeout] = [BodyTooLarge(0), RequestTimeout()]
    for exc in body_limits:
        add(exc.code, exc.status_code, _meaning(type(exc)), _source(type(exc)))
    for code, (status, meaning) in HANDLER_CODES.items():
        add(code, status, meaning, "`producers.api.errors`")
    for reason, said in DOCUMENT_REASONS.items():  # POST /v1/documents: why a file is unread
        add(reason, said.status, _inline(said.text), "`plumbing.documents.errors.REASONS`")
    return sorted(found.values(), key=lambda e: (min(s or 0 for s in e.statuses), e.code))


def refusals() -> list[tuple[str, int, str]]:
    """(reason, status, meaning) of every admission refusal."""
    return [
        (reason, 503 if reason in UNAVAILABLE else Refused.status, meaning)
        for reason, meaning in REFUSALS.items()
    ]


# Rendering.


def _inline(text: str) -> str:
    """Docstring text as one Markdown line: RST literals as code, no line breaks, and
    ``<`` outside code escaped (``<API key>`` is no HTML tag)."""
    text = re.sub(r"``([^`]+)``", r"`\1`", " ".join(text.split()))
    parts = text.split("`")
    for i in range(0, len(parts), 2):
        parts[i] = parts[i].replace("<", "&lt;")
    return "`".join(parts)


def _cell(text: str) -> str:
    return _inline(text).replace("|", "\\|")


def _ref_name(ref: str) -> str:
    return ref.rsplit("/", 1)[-1]


def _anchor(name: str) -> str:
    return "#" + re.sub(r"[^a-z0-9_ -]", "", name.lower()).replace(" ", "-")


class Renderer:
    def __init__(self, document: Schema) -> None:
        self.doc = document
        self.components: dict[str, Schema] = document.get("components", {}).get("schemas", {})
        self.operations = [
            (method, path, op)
            for path, ops in sorted(document["paths"].items())
            for method in METHODS
            if (op := ops.get(method)) is not None
        ]
        # What a request header means: the first description the document gives it.
        self.header_texts: dict[str, str] = {}
        for _, _, op in self.operations:
            for param in op.get("parameters", []):
                text = param.get("description") or self.description(param.get("schema", {}))
                if param.get("in") == "header" and text:
                    self.header_texts.setdefault(param["name"].lower(), text)

    # Types

    def type_of(self, schema: Schema) -> str:
        if "$ref" in schema:
            name = _ref_name(schema["$ref"])
            target = self.components.get(name, {})
            if "enum" in target:
                return "one of " + ", ".join(f"`{v}`" for v in target["enum"])
            if name in self.components:
                return f"[{name}]({_anchor(name)})"
            return name
        for key in ("anyOf", "oneOf"):
            if key in schema:
                kinds: list[str] = []
                for sub in schema[key]:
                    if sub.get("type") == "null":
                        continue
                    text = self.type_of(sub)
                    if text not in kinds:
                        kinds.append(text)
                merged = " or ".join(kinds) if kinds else "null"
                nullable = any(sub.get("type") == "null" for sub in schema[key])
                return merged + (" or null" if nullable else "")
        if "enum" in schema:
            return "one of " + ", ".join(f"`{v}`" for v in schema["enum"])
        kind = schema.get("type")
        if kind == "array":
            return "array of " + self.type_of(schema.get("items", {}))
        if kind == "object" and isinstance(schema.get("additionalProperties"), dict):
            return "object of " + self.type_of(schema["additionalProperties"])
        if kind is None:
            return "any"
        text = str(kind)
        if fmt := schema.get("format"):
            text += f" ({fmt})"
        return text

    def constraints(self, schema: Schema) -> list[str]:
        found: list[str] = []
        for sub in [schema, *schema.get("anyOf", []), *schema.get("oneOf", [])]:
            for key, template in _CONSTRAINTS:
                if key in sub:
                    value = sub[key]
                    if isinstance(value, float) and value.is_integer():
                        value = int(value)
                    found.append(template.format(value))
            if sub is not schema:
                found.extend(self.constraints({k: v for k, v in sub.items() if k != "anyOf"}))
        return list(dict.fromkeys(found))

    def param_text(self, param: Schema) -> str:
        text = param.get("description") or self.description(param.get("schema", {}))
        if not text and param.get("in") == "header":
            return self.header_texts.get(param["name"].lower(), "")
        return str(text)

    @staticmethod
    def description(schema: Schema) -> str:
        if text := schema.get("description"):
            return str(text)
        for sub in schema.get("anyOf", []):
            if text := sub.get("description"):
                return str(text)
        return ""

    def fields_table(self, schema: Schema) -> list[str]:
        required = set(schema.get("required", ()))
        lines = [
            "| field | type | required | default | constraints | description |",
            "| --- | --- | --- | --- | --- | --- |",
        ]
        for name, prop in schema.get("properties", {}).items():
            default = f"`{_json(prop['default'])}`" if "default" in prop else ""
            lines.append(
                f"| `{name}` | {_cell(self.type_of(prop))} | "
                f"{'yes' if name in required else ''} | {default} | "
                f"{_cell(', '.join(self.constraints(prop)))} | {_cell(self.description(prop))} |"
            )
        return lines

    def body_name(self, schema: Schema) -> str:
        if "$ref" in schema or "anyOf" in schema or "oneOf" in schema:
            return self.type_of(schema)
        if (title := schema.get("title")) and not title.startswith("Response "):
            return f"`{title}`"  # an inline model (FastAPI names the others "Response ...")
        return self.type_of(schema)

    def resolve(self, schema: Schema) -> Schema:
        if "$ref" in schema:
            return self.components.get(_ref_name(schema["$ref"]), {})
        return schema

    # Sections

    def render(self) -> str:
        info = self.doc.get("info", {})
        out = [
            "# The Sluicegate HTTP API",
            "",
            "<!-- Generated by `python -m tools.apidoc --write` from the app's OpenAPI",
            "document and the code's error codes; do not edit by hand. A route change without",
            "regenerating fails tests/unit/test_apidoc.py. -->",
            "",
            f"{info.get('title', '')} {info.get('version', '')}, OpenAPI "
            f"{self.doc.get('openapi', '')}. A running API serves the same document at "
            "`/openapi.json` (and `/docs`).",
            "",
            "| method | path | summary |",
            "| --- | --- | --- |",
        ]
        for method, path, op in self.operations:
            title = f"{method.upper()} {path}"
            out.append(
                f"| `{method.upper()}` | [`{path}`]({_anchor(title)}) | "
                f"{_cell(op.get('summary', ''))} |"
            )
        channel_title = f"WEBSOCKET {channel.PATH}"
        out.append(
            f"| `WEBSOCKET` | [`{channel.PATH}`]({_anchor(channel_title)}) | "
            "Single submits over one connection, each answered as `POST /v1/jobs` answers it |"
        )
        out += ["", *self.headers(), *self.errors(), "## Operations", ""]
        for method, path, op in self.operations:
            out += self.operation(method, path, op)
        out += [f"### {channel_title}", "", inspect.cleandoc(channel.__doc__ or ""), ""]
        out += self.models()
        return "\n".join(out).rstrip() + "\n"

    def headers(self) -> list[str]:
        """Request headers (parameters) and response headers, as the document gives them."""
        names: dict[str, str] = {}
        used: dict[str, list[str]] = {}
        response: dict[str, tuple[str, dict[str, list[str]]]] = {}
        for method, path, op in self.operations:
            where = f"`{method.upper()} {path}`"
            for param in op.get("parameters", []):
                if param.get("in") != "header":
                    continue
                key = param["name"].lower()
                names.setdefault(key, param.get("schema", {}).get("title") or param["name"])
                used.setdefault(key, []).append(where)
            for status, answer in op.get("responses", {}).items():
                for name, header in answer.get("headers", {}).items():
                    _, by_where = response.setdefault(name, (header.get("description", ""), {}))
                    by_where.setdefault(where, []).append(status)
        v1 = [f"`{m.upper()} {p}`" for m, p, _ in self.operations if p.startswith("/v1/")]
        out = [
            "## Headers",
            "",
            "| header | direction | where | meaning |",
            "| --- | --- | --- | --- |",
        ]
        for key, ops in used.items():
            ops_text = "every `/v1` operation" if ops == v1 else ", ".join(ops)
            text = _cell(self.header_texts.get(key, ""))
            out.append(f"| `{names[key]}` | request | {ops_text} | {text} |")
        for name, (text, by_op) in response.items():
            groups: dict[str, list[str]] = {}
            for op_name, codes in by_op.items():
                groups.setdefault(", ".join(sorted(codes, key=_num)), []).append(op_name)
            parts = []
            for statuses_text, ops in groups.items():
                on = ", ".join(ops) if len(ops) <= 2 else f"{len(ops)} operations"
                parts.append(f"{statuses_text} of {on}")
            out.append(f"| `{name}` | response | {'; '.join(parts)} | {_cell(text)} |")
        out += [
            "",
            "The caller is authenticated by `Authorization: Bearer <API key>` (setting "
            "`auth = api_key`, the default) or named by `X-Sluicegate-Tenant` (`auth = "
            "tenant_header`, behind a gateway that authenticates); every `/v1` operation is "
            "scoped to that tenant.",
            "",
        ]
        return out

    def errors(self) -> list[str]:
        out = [
            "## Error codes",
            "",
            'An error answer is `{"error": {"code", "message", "details"}}` '
            f"([ErrorResponse]({_anchor('ErrorResponse')})); its `code` is one of these, "
            "and stays the same from release to release.",
            "",
            "| code | HTTP status | meaning | defined by |",
            "| --- | --- | --- | --- |",
        ]
        for err in error_codes():
            statuses = ", ".join(str(s) if s else "varies" for s in sorted(err.statuses, key=_num))
            out.append(
                f"| `{err.code}` | {statuses} | {_cell(' '.join(err.meanings))} | "
                f"{', '.join(dict.fromkeys(err.sources))} |"
            )
        out += [
            "",
            "### Admission refusals",
            "",
            "A refused submit stores nothing. Its answer carries `Retry-After` and the yield "
            'body `{"status": "yield", "retry_after_ms", "reason", "lag", "error": {"code", '
            '"message"}}`, whose `reason` and `error.code` are one of these '
            "(`producers/admission/policy.py`):",
            "",
            "| code | HTTP status | meaning |",
            "| --- | --- | --- |",
        ]
        for reason, status, meaning in refusals():
            out.append(f"| `{reason}` | {status} | {_cell(meaning)} |")
        out += [
            "",
            "### Why a job ended without a result",
            "",
            "A job's own `error` (`GET /v1/jobs/{job_id}`, webhooks, batch output) is "
            '`{"code", "reason", "message", "stage"}`: `code` is the reason for an expired '
            "job and the state otherwise (`cancelled`, `abandoned`; `failed` carries the "
            "engine's error code); `stage` is `before_decode` or `decode` "
            "(`schemas/reasons.py`, [drops.md](drops.md)).",
            "",
            "| reason | meaning |",
            "| --- | --- |",
        ]
        for reason, message in reasons.MESSAGES.items():
            out.append(f"| `{reason}` | {_cell(message)} |")
        return [*out, ""]

    def operation(self, method: str, path: str, op: Schema) -> list[str]:
        out = [f"### {method.upper()} {path}", ""]
        if summary := op.get("summary"):
            out += [f"**{_inline(summary)}.**" if not summary.endswith(".") else summary, ""]
        if text := op.get("description"):
            out += [_inline(text), ""]
        params = op.get("parameters", [])
        auth = any(p["name"].lower() in AUTH_HEADERS for p in params)
        out += [
            "Auth: " + ("API key or tenant header ([Headers](#headers))." if auth else "none."),
            "",
        ]
        shown = [p for p in params if p["name"].lower() not in AUTH_HEADERS]
        if shown:
            out += [
                "| parameter | in | type | required | constraints | description |",
                "| --- | --- | --- | --- | --- | --- |",
            ]
            for p in shown:
                schema = p.get("schema", {})
                name = schema.get("title") if p["in"] == "header" else p["name"]
                default = f" (default `{_json(schema['default'])}`)" if "default" in schema else ""
                out.append(
                    f"| `{name or p['name']}` | {p['in']} | {_cell(self.type_of(schema))}"
                    f"{default} | {'yes' if p.get('required') else ''} | "
                    f"{_cell(', '.join(self.constraints(schema)))} | "
                    f"{_cell(self.param_text(p))} |"
                )
            out.append("")
        if body := op.get("requestBody"):
            out += self.request_body(body)
        out += self.responses(op.get("responses", {}))
        return out

    def request_body(self, body: Schema) -> list[str]:
        out = ["Request body" + (" (required):" if body.get("required") else ":"), ""]
        for media, content in body.get("content", {}).items():
            schema = content.get("schema", {})
            line = f"- `{media}`: {self.body_name(schema)}"
            resolved = self.resolve(schema)
            if props := resolved.get("properties"):
                required = set(resolved.get("required", ()))
                names = [f"`{n}`" + (" (required)" if n in required else "") for n in props]
                line += "; fields " + ", ".join(names)
            elif text := self.description(resolved):
                line += f": {_inline(text)}"
            out.append(line)
        return [*out, ""]

    def responses(self, responses: Schema) -> list[str]:
        out = ["| status | meaning | body | headers |", "| --- | --- | --- | --- |"]
        failures: list[str] = []
        for status, answer in sorted(responses.items(), key=lambda kv: _num(kv[0])):
            content = answer.get("content", {})
            if _num(status) >= 400 and "ErrorResponse" in str(content):
                failures.append(status)
                continue
            bodies = []
            for media, item in content.items():
                schema = item.get("schema")
                bodies.append(self.body_name(schema) if schema else f"`{media}`")
            headers = ", ".join(f"`{h}`" for h in answer.get("headers", {}))
            out.append(
                f"| {status} | {_cell(answer.get('description', ''))} | "
                f"{' or '.join(bodies)} | {headers} |"
            )
        if failures:
            out.append(
                f"| {', '.join(failures)} | errors ([codes](#error-codes)) | "
                f"[ErrorResponse]({_anchor('ErrorResponse')}) | " + _retry_after(failures) + " |"
            )
        return [*out, ""]

    def models(self) -> list[str]:
        out = ["## Models", ""]
        for name, schema in sorted(self.components.items()):
            out += [f"### {name}", ""]
            if text := schema.get("description"):
                out += [_inline(text), ""]
            if "enum" in schema:
                out += ["One of " + ", ".join(f"`{v}`" for v in schema["enum"]) + ".", ""]
            elif schema.get("properties"):
                out += [*self.fields_table(schema), ""]
        return out


def _retry_after(statuses: list[str]) -> str:
    retried = [s for s in statuses if s in ("429", "503")]
    return f"`Retry-After` ({', '.join(retried)})" if retried else ""


def _num(status: object) -> int:
    try:
        return int(str(status))
    except ValueError:
        return 0


def _json(value: object) -> str:
    return json.dumps(value)


def render() -> str:
    return Renderer(openapi_document()).render()


def main(argv: list[str] | None = None) -> int:
    return generated.main(argv, module="tools.apidoc", doc=DOC, description=__doc__, render=render)


if __name__ == "__main__":
    raise SystemExit(main())
