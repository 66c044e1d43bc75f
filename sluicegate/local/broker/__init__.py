"""The local stack's broker: Apache Kafka from its Maven Central jars (``dist``, ``apache``),
or the memory-only Tansu fallback (``tansu``), and the choice between them (``choose``)."""
