"""The group coordinator (spec 000, "Consumer Coordinator"): groups and their members under
Kafka's classic protocol, committed and pending transactional offsets, and the
``__consumer_offsets`` record format; server/group_service.py drives it."""
