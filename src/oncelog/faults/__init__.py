"""Faults as Jepsen injects them (issue 31): hosts in network namespaces (``net``), a link proxy
for delay and loss (``linkproxy``), clock skew (``clock``), full disks (``disk``), a replicated
cluster across those hosts (``cluster``), and the seeded fault schedule (``nemesis``)."""
