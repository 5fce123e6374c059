"""Cluster mode: brokers coordinated by Apache ZooKeeper, laid out as Kafka's ZooKeeper mode
(docs/cluster.md). Only what a broker runs in cluster mode lives here; running ZooKeeper and
brokers on this machine (tests, ``oncelog cluster up``) is ``oncelog.harness``'s.

- ``model``, ``errors``: the cluster's values (``BrokerInfo``, ``LeaderAndIsr``,
  ``TopicAssignment``, the immutable ``ClusterView`` snapshot) and refusals, shared with a
  single node's metadata; no kazoo;
- ``zk_data``: the znodes, one class per path with its encoding (Kafka's ZkData);
- ``zookeeper_client``, ``zk_client``: one ZooKeeper session (``ZooKeeperClient``) and the
  operations on the znodes (``KafkaZkClient``), which composes one part per responsibility,
  each given the session: ``zk_brokers``, ``zk_election``, ``zk_topics``,
  ``zk_partition_states``, ``zk_configs``, ``zk_producer_ids`` (and ``zk_user_configs``, the
  SCRAM users, on the same session);
- ``metadata_view``: a broker's picture of the cluster kept by watches (``MetadataView`` ->
  ``ClusterView`` snapshots);
- ``controller``: the controller's decisions (sans-IO) and its thread (``Controller``).

This package's ``__init__`` imports nothing; of the submodules, ``zookeeper_client``, the
``zk_*`` modules but ``zk_data`` and ``controller`` import kazoo.
"""
