"""The consumer: the API (consumer.py), the fetcher, the subscription state, and the group
membership (group_coordinator.py) with its assignors. The public names are ``oncelog``'s
(``from oncelog import Consumer``)."""
