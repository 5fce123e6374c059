"""Faults as Jepsen injects them: hosts in network namespaces, fault families, workloads."""
