"""The long-running roles (``api``, ``relay``, ``worker``, ``webhooks``), the engine servers
(``sim-server``, ``llama-server``) and ``migrate``."""

from __future__ import annotations

import argparse
import sys

from plumbing.settings import MissingSetting, Settings
from producers import service
from sluicegate import migrate
from sluicegate.local import model as models
from sluicegate.process import configure_logging, run_until_signal
from workers.engines.build import build_sim_engine
from workers.engines.errors import EngineError
from workers.engines.llamacpp import server as llamacpp_server
from workers.engines.sim import server as sim_server
from workers.group.threaded_consumer import ProtocolUnsupported
from workers.service import run_worker
from workers.webhooks.process import run_webhooks

ROLES = {"llama-server": "llama"}
"""A command's role in log lines, where it is not the command's name."""


def run(settings: Settings, args: argparse.Namespace) -> None:
    configure_logging(settings, ROLES.get(args.command, args.command))
    try:
        _run(settings, args)
    except MissingSetting as exc:
        sys.exit(
            f"sluicegate {args.command}: {exc}. A role runs against a stack's PostgreSQL and "
            "Kafka; `sluicegate up` runs the whole local stack"
        )


def _run(settings: Settings, args: argparse.Namespace) -> None:
    command = args.command
    if command == "api":
        overrides = {"api_host": args.host, "api_port": args.port}
        settings = settings.model_copy(update={k: v for k, v in overrides.items() if v})
        service.serve_api(settings, processes=args.workers)
    elif command == "sim-server":
        _sim_server(settings, args)
    elif command == "llama-server":
        try:
            model = models.model_file(settings)
            run_until_signal(
                lambda stop: llamacpp_server.serve(settings.engines.llamacpp, model, stop)
            )
        except llamacpp_server.ServerNotStarted as exc:
            sys.exit(str(exc))
    elif command == "relay":
        run_until_signal(lambda stop: service.run_relay(settings, stop))
    elif command == "worker":
        try:
            run_until_signal(lambda stop: run_worker(settings, stop))
        except EngineError as exc:  # its engine did not start: wrong model, server down
            sys.exit(f"the worker's engine did not start ({exc.code}): {exc}")
        except ProtocolUnsupported as exc:
            sys.exit(f"sluicegate worker (group_protocol_unsupported): {exc}")
    elif command == "webhooks":
        run_until_signal(lambda stop: run_webhooks(settings, stop))
    elif command == "migrate":
        migrate.upgrade(settings.require_database_url())


def _sim_server(settings: Settings, args: argparse.Namespace) -> None:
    names = args.served_names or [settings.vllm_model]
    sim = settings.engines.sim
    app = sim_server.create_app(
        build_sim_engine(sim),
        model=names[0],
        aliases=names[1:],
        max_model_len=args.max_model_len,
        stream_interval=args.stream_interval,
        enable_request_id_headers=args.enable_request_id_headers,
        data_parallel=[build_sim_engine(sim) for _ in range(args.data_parallel_size - 1)],
    )
    run_until_signal(lambda stop: sim_server.serve(app, host=args.host, port=args.port, stop=stop))
