"""The plumbing every process stands on: settings (one group per component), the database,
Kafka and LISTEN/NOTIFY factories, the retry helper, asyncio helpers, metrics helpers and the
lock store. It imports ``schemas`` only: never the producers, the workers, the client side or
the ``sluicegate`` command."""
