"""The worker group's lag: readers of Kafka offsets and PostgreSQL, and the rule over them."""
