"""Faults as Jepsen injects them (issue 31): hosts, faults, workloads, the runner."""
