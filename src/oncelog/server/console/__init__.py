"""The broker's read-only web console (``console.port``; ``oncelog broker --console-port``).

Server-rendered HTML with inline SVG charts, served from the broker's own event loop: topics
and partitions with their log start offset, last stable offset and high watermark (and both
over the last minutes), open and hanging transactions, consumer groups with their lag, brokers
and partition leaders. docs/console.md shows it.

- ``httpd``: the small HTTP/1.1 server (bounded requests, Basic authentication with SASL on);
- ``pages`` and ``layout``: the pages, every value escaped;
- ``sampler`` and ``chart``: the HW and LSO history of each partition, and its SVG.
"""

from .httpd import ConsoleServer, start_console_server, start_http_server

__all__ = ["ConsoleServer", "start_console_server", "start_http_server"]
