"""The transaction coordinator (spec 000, "Transaction Coordinator"): its states, its log's
record format, and the sans-IO coordinator (txn/coordinator.py) that server/txn_service.py
drives."""
