"""oncelog: a Kafka-protocol streaming log with exactly-once semantics."""
