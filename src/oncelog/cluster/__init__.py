"""Cluster mode: brokers coordinated by Apache ZooKeeper, laid out as Kafka's ZooKeeper mode
(docs/cluster.md).

- ``zookeeper``: run Debian's ZooKeeper server (tests, ``oncelog cluster up``);
- ``zk``: the ZooKeeper data model (``ClusterStore``) and a broker's watched picture of the
  cluster (``MetadataView`` -> immutable ``ClusterView`` snapshots);
- ``controller``: the controller's decisions (sans-IO) and its thread (``Controller``).
- ``local``: a ZooKeeper and N broker processes on this machine (``LocalCluster``; tests,
  benchmarks, ``oncelog cluster up`` / ``down``).

The submodules import kazoo; this package's ``__init__`` imports nothing, so single-node brokers
never load it.
"""
