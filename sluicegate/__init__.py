"""The ``sluicegate`` command and the composition root: its flags (``sluicegate.cli``); the
commands (``sluicegate.commands``) that start the services (api, relay, worker, webhooks),
pull the model and Apache Kafka, migrate the database, manage API keys, and submit to,
summarize with and read a running stack; and the one-command local stack with its embedded
PostgreSQL and broker (``sluicegate.local``). It is the only package that imports the
producers, the workers and the client together."""

__version__ = "0.1.0"
