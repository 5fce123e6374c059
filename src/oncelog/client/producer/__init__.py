"""The producer: the API (producer.py), the record accumulator and its batches, the sender
thread, the partitioner, and the transactional state machine with its coordinator requests.
The public names are ``oncelog``'s (``from oncelog import Producer``)."""
