"""What one scrape of the metrics page costs the broker's event loop, on a broker with many
partitions (the page is built on the loop, so this is time no request is served).

    .venv/bin/python benchmarks/bench_metrics.py [--partitions 2000] [--rounds 10]

Prints the CPU seconds (``time.thread_time`` on the loop's thread, median of ``--rounds``) of
building the page in both formats, and the page's size; then the same through HTTP as a client
sees it (wall time, median).
"""

from __future__ import annotations

import argparse
import statistics
import time
import urllib.request

from oncelog import Admin, NewTopic, Producer
from oncelog.server import metrics
from oncelog.server.embedded import EmbeddedBroker

PARTITIONS_PER_TOPIC = 50


def timed_on_loop(b: EmbeddedBroker, fn, *args) -> tuple[float, object]:
    def run():
        start = time.thread_time()
        out = fn(*args)
        return time.thread_time() - start, out

    return b.call(run)


def page(broker, openmetrics: bool) -> bytes:
    build = getattr(metrics, "page", None)
    if build is not None:  # this checkout: the page as the HTTP server builds it
        return build(broker, None, openmetrics)[1]
    return metrics.render(metrics.collect(broker), openmetrics).encode()  # before prometheus_client


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--partitions", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=10)
    args = parser.parse_args()
    with EmbeddedBroker(config={"metrics.port": "0", "offsets.topic.num.partitions": "2",
                                "transaction.state.log.num.partitions": "2"}) as b:
        topics = max(1, args.partitions // PARTITIONS_PER_TOPIC)
        with Admin(bootstrap_servers=b.bootstrap_servers) as admin:
            for i in range(topics):  # one at a time: a loaded machine answers each in time
                admin.create_topics([NewTopic(f"bench-{i}", PARTITIONS_PER_TOPIC, 1)])
        with Producer(bootstrap_servers=b.bootstrap_servers) as p:
            for i in range(topics):
                for part in range(PARTITIONS_PER_TOPIC):
                    p.send(f"bench-{i}", value=b"x", partition=part)
        print(f"partitions: {topics * PARTITIONS_PER_TOPIC}")
        for om in (False, True):
            runs = [timed_on_loop(b, page, b.broker, om) for _ in range(args.rounds)]
            cpu = statistics.median(r[0] for r in runs)
            size = len(runs[-1][1])  # type: ignore[arg-type]
            print(f"{'openmetrics' if om else 'text 0.0.4'}: {cpu * 1e3:.1f} ms CPU "
                  f"(median of {args.rounds}), {size / 1024:.0f} KiB")
        url = f"http://127.0.0.1:{b.server.metrics_port}/metrics"
        walls = []
        for _ in range(args.rounds):
            start = time.perf_counter()
            with urllib.request.urlopen(url, timeout=60) as r:
                r.read()
            walls.append(time.perf_counter() - start)
        print(f"HTTP scrape: {statistics.median(walls) * 1e3:.1f} ms wall (median)")


if __name__ == "__main__":
    main()
