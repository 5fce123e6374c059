"""Brokers as processes on this machine, for the tests, the benchmarks, ``oncelog verify`` and
``oncelog cluster up`` / ``down``; a broker itself never imports this package.

- ``broker_process``: ``BrokerProcess``, the one broker launcher (``oncelog broker`` as a child:
  its "listening" line read with a deadline, kill / stop / pause / resume, the same port again
  on restart, its log's tail shown on failure);
- ``local_cluster``: ``LocalCluster``, a ZooKeeper and N ``BrokerProcess`` brokers, a fault
  injector and observer; ``cluster_down`` and the ``oncelog cluster`` subcommands;
- ``zookeeper``: Debian's ZooKeeper server as a process (``ZooKeeperServer``);
- ``relay``: a TCP relay in front of a broker, to cut it off the network (``Relay``).

This package's ``__init__`` imports nothing: each user loads only the part it needs.
"""
