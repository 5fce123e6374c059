"""Faults as Jepsen injects them (issue 31): hosts in network namespaces (``net``), a link proxy
for delay and loss (``linkproxy``), clock skew (``clock``), full disks (``disk``), a replicated
cluster across those hosts (``cluster``), the seeded fault schedule (``nemesis``), the workload
clients (``clients``, ``spark_job``), and the runner with its report (``run``, ``report``,
``plot``: ``bash scripts/faults.sh``)."""
