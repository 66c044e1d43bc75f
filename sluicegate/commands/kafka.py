"""``sluicegate kafka run``: Apache Kafka as a single KRaft node in the foreground, its log in
the data directory; ``sluicegate kafka consumer-groups``: Kafka's own tool on the pulled
jars. (``sluicegate kafka pull`` is in ``sluicegate.commands.pull``.)"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys

from plumbing.settings import Settings
from sluicegate.local import info as stack_info
from sluicegate.local.broker import dist
from sluicegate.local.broker.apache import ApacheKafka
from sluicegate.local.broker.choose import home_of
from sluicegate.local.embedded import EmbeddedError
from sluicegate.process import run_until_signal

CONSUMER_GROUPS = "org.apache.kafka.tools.consumer.group.ConsumerGroupCommand"
# The JVM's exit status after SIGTERM once its shutdown hooks (Kafka's controlled
# shutdown) have run.
SIGTERM_EXIT = 128 + 15


def run(settings: Settings, args: argparse.Namespace) -> None:
    try:
        java = dist.find_java(java_home=os.environ.get("JAVA_HOME"))
        home = home_of(settings)
        if not dist.is_pulled(home):
            raise dist.NotPulled(f"no Apache Kafka in {home}: run `sluicegate kafka pull` first")
    except dist.KafkaUnavailable as exc:
        sys.exit(f"sluicegate kafka {args.kafka_command} ({exc.code}): {exc}")
    if args.kafka_command == "consumer-groups":
        sys.exit(_consumer_groups(settings, java, home, args.tool_args))
    broker = ApacheKafka(
        root=settings.data_dir / "kafka",
        home=home,
        java=java,
        heap_mb=settings.kafka_heap_mb,
        port=args.port,
        controller_port=args.controller_port,
        log_path=settings.data_dir / "broker.log",
    )
    try:
        code = run_until_signal_code(broker)
    except EmbeddedError as exc:
        sys.exit(f"Apache Kafka did not start: {exc} (log: {broker.log_path})")
    sys.exit(code)


def run_until_signal_code(broker: ApacheKafka) -> int:
    """Run the broker until SIGTERM or SIGINT (then a controlled shutdown: exit 0) or until
    it exits by itself (exit 1)."""
    result: list[int] = []

    async def main(stop: asyncio.Event) -> None:
        await broker.start()
        rss = broker.rss_bytes() or 0
        print(
            f"Apache Kafka {broker.info.version} on {broker.bootstrap} (KRaft, broker and "
            f"controller; log in {broker.data}); started in {broker.started_in_s:.1f} s, "
            f"RSS {rss / 2**20:.0f} MiB. Ctrl-C or SIGTERM stops it.",
            flush=True,
        )
        exited = asyncio.ensure_future(asyncio.to_thread(broker.wait))
        stopping = asyncio.ensure_future(stop.wait())
        await asyncio.wait([exited, stopping], return_when=asyncio.FIRST_COMPLETED)
        if exited.done():
            stopping.cancel()
            print(f"Apache Kafka exited by itself{broker.last_line()}", file=sys.stderr)
            result.append(1)
            return
        code = await asyncio.to_thread(broker.terminate)
        await exited
        clean = code in (0, SIGTERM_EXIT)
        print("Apache Kafka stopped" + (" (controlled shutdown)" if clean else f" ({code})"))
        result.append(0 if clean else 1)

    run_until_signal(main)
    return result[0] if result else 1


def _consumer_groups(
    settings: Settings, java: dist.Java, home: os.PathLike[str], tool_args: list[str]
) -> int:
    """Kafka's kafka-consumer-groups, on the running stack's broker unless the arguments
    name one (``--bootstrap-server``)."""
    args = list(tool_args)
    if "--bootstrap-server" not in args:
        info = stack_info.read_info(settings.data_dir)
        bootstrap = settings.kafka_bootstrap_servers or (info or {}).get("kafka")
        if not bootstrap:
            print(
                "no running stack on this data directory: give --bootstrap-server",
                file=sys.stderr,
            )
            return 2
        args = ["--bootstrap-server", str(bootstrap), *args]
    command = [str(java.path), "-cp", f"{home}/libs/*", CONSUMER_GROUPS, *args]
    return subprocess.run(command, check=False).returncode
