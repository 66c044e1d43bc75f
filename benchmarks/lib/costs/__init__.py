"""The costs benchmark's meters: what one accepted job costs each process, PostgreSQL and the
broker, counted over windows of load on one stack (``measure``)."""
