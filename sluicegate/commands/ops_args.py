"""The flags of ``status``, ``jobs``, ``batches`` and ``webhooks redeliver``: the read side of
a running stack, through its API. Only argparse here (``sluicegate.cli`` imports it at
start); the commands themselves are in ``sluicegate.commands.ops``."""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from typing import Any, Protocol

# The API's names (schemas.states.JobState, schemas.batches.Status), spelled out so that
# a bad name is refused by argparse without importing the schemas at start.
JOB_STATES = (
    "queued",
    "dispatched",
    "running",
    "succeeded",
    "failed",
    "expired",
    "cancelled",
    "abandoned",
)
BATCH_STATUSES = (
    "validating",
    "failed",
    "in_progress",
    "finalizing",
    "cancelling",
    "completed",
    "expired",
    "cancelled",
)
COMMANDS = ("status", "jobs", "batches")
API_HELP = "API base URL (default: the local stack's, else SLUICEGATE_API_HOST:API_PORT)"


class Subcommands(Protocol):
    """What ``ArgumentParser.add_subparsers()`` returns, as the commands use it (its class
    is private to argparse): a parser for each subcommand, and those made so far."""

    @property
    def choices(self) -> Mapping[str, argparse.ArgumentParser]: ...

    def add_parser(self, name: str, **kwargs: Any) -> argparse.ArgumentParser: ...


def add(sub: Subcommands) -> None:
    status = sub.add_parser(
        "status",
        help="the pipeline at a glance: admission and lag, jobs by model and state, drops, workers",
    )
    status.add_argument("--api", default=None, help=API_HELP)
    status.add_argument(
        "--window", default="5m", help="ended jobs and drops of this long (default: %(default)s)"
    )
    status.add_argument("--watch", action="store_true", help="refresh in place until Ctrl-C")
    status.add_argument(
        "--interval", type=float, default=2.0, help="--watch's refresh, s (default: %(default)s)"
    )
    jobs = sub.add_parser("jobs", help="list jobs by state, model, tenant or batch; jobs show ID")
    jobs.add_argument("--api", default=None, help=API_HELP)
    jobs_sub = jobs.add_subparsers(dest="jobs_command", required=False, metavar="show ID")
    show = jobs_sub.add_parser(
        "show",
        help="one job: its state and times, tokens, why its output ended (finish_reason), "
        "its error or its text, and its webhook deliveries",
    )
    show.add_argument("job_id")
    show.add_argument("--api", default=argparse.SUPPRESS, help=API_HELP)
    jobs.add_argument("--state", action="append", choices=JOB_STATES, help="repeatable")
    jobs.add_argument("--batch", default=None, help="a batch's jobs")
    _filters(jobs)
    batches = sub.add_parser("batches", help="list batches by status, model or tenant")
    batches.add_argument("--api", default=None, help=API_HELP)
    batches.add_argument("--status", action="append", choices=BATCH_STATUSES, help="repeatable")
    _filters(batches)
    webhooks = sub.choices["webhooks"]  # `sluicegate webhooks` alone runs the dispatcher
    hooks_sub = webhooks.add_subparsers(dest="webhooks_command", required=False)
    redeliver = hooks_sub.add_parser("redeliver", help="send a dead webhook delivery again")
    redeliver.add_argument("delivery_id")
    redeliver.add_argument("--api", default=None, help=API_HELP)


def _filters(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default=None)
    parser.add_argument("--tenant", default=None, help="another tenant's: operator keys only")
    parser.add_argument("--limit", type=int, default=50, help="at most (default: %(default)s)")


def wanted(args: argparse.Namespace) -> bool:
    """Whether the command line asks for one of these commands."""
    return args.command in COMMANDS or (
        args.command == "webhooks" and getattr(args, "webhooks_command", None) is not None
    )
