"""What the web console costs the broker's event loop: the HW/LSO sampler's tick and one render
of each page, on a broker with many partitions.

    .venv/bin/python benchmarks/bench_console.py [--partitions 2000] [--rounds 20]

The sampler reads every hosted partition's high watermark and last stable offset once a second
on the broker's loop, so its tick is time no request is served: the figure is the CPU seconds of
one tick (``time.thread_time`` on the loop's thread, median of ``--rounds``) and its share of
the one-second interval. Pages are rendered on the loop too: the CPU of each render is printed
with the page's size (tables are capped at 500 rows).
"""

from __future__ import annotations

import argparse
import statistics
import time
import urllib.request

from oncelog import Admin, NewTopic, Producer
from oncelog.server.embedded import EmbeddedBroker

PARTITIONS_PER_TOPIC = 50


def timed_on_loop(b: EmbeddedBroker, fn, *args) -> float:
    def run():
        start = time.thread_time()
        fn(*args)
        return time.thread_time() - start

    return b.call(run)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--partitions", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=20)
    args = parser.parse_args()
    with EmbeddedBroker(config={"console.port": "0", "offsets.topic.num.partitions": "2",
                                "transaction.state.log.num.partitions": "2"}) as b:
        topics = max(1, args.partitions // PARTITIONS_PER_TOPIC)
        with Admin(bootstrap_servers=b.bootstrap_servers) as admin:
            admin.create_topics([NewTopic(f"bench-{i}", PARTITIONS_PER_TOPIC, 1)
                                 for i in range(topics)])
        with Producer(bootstrap_servers=b.bootstrap_servers) as p:
            for i in range(topics):
                for part in range(PARTITIONS_PER_TOPIC):
                    p.send(f"bench-{i}", value=b"x", partition=part)
        console = b.server.console
        n = topics * PARTITIONS_PER_TOPIC
        ticks = [timed_on_loop(b, console.sampler.sample) for _ in range(args.rounds)]
        tick = statistics.median(ticks)
        print(f"partitions: {n}")
        print(f"sampler tick: {tick * 1e3:.2f} ms CPU (median of {args.rounds}), "
              f"{tick / n * 1e6:.2f} us per partition, "
              f"{tick / console.sampler.interval_s:.2%} of the loop at one tick a second")
        pages = console._render  # the renderer the HTTP handler calls, timed without the socket
        from oncelog.server.console.auth import Viewer

        viewer = Viewer("User:ANONYMOUS", "127.0.0.1", b.broker.security.authorizer)
        for path in ("/topics", "/topics/bench-0", "/transactions", "/groups", "/brokers"):
            cpu = statistics.median(timed_on_loop(b, pages, path, viewer, lambda _k: False)
                                    for _ in range(5))
            url = f"http://127.0.0.1:{console.port}{path}"
            with urllib.request.urlopen(url, timeout=60) as r:
                size = len(r.read())
            print(f"render {path}: {cpu * 1e3:.1f} ms CPU, {size / 1024:.0f} KiB")


if __name__ == "__main__":
    main()
