"""The metrics page of a broker process, read as Prometheus reads it: tests/test_metrics_*.py."""

from __future__ import annotations

import base64
import re
import urllib.request
from urllib.parse import urlsplit, urlunsplit

from prometheus_client.metrics_core import Metric
from prometheus_client.openmetrics.parser import (
    text_string_to_metric_families as openmetrics_families,
)
from prometheus_client.parser import text_string_to_metric_families

from support.waiting import wait_until

OPENMETRICS_ACCEPT = ("application/openmetrics-text;version=1.0.0;q=0.6,"
                      "text/plain;version=0.0.4;q=0.3,*/*;q=0.2")  # what Prometheus sends


def metrics_url(broker, user: str | None = None, password: str | None = None) -> str:
    """The page's address: the broker (a BrokerProcess started with ``metrics.port`` 0) says
    it on its second line, which its log file holds. With ``user``, the address carries the
    credentials ``fetch`` logs in with (HTTP Basic, as Prometheus' ``basic_auth``)."""
    def said():
        m = re.search(r"oncelog metrics at (https?://\S+)", broker.log_path.read_text())
        return m.group(1) if m else None
    url = wait_until(said, 10, "the broker's metrics line")
    if user is not None:
        scheme, rest = url.split("://", 1)
        url = f"{scheme}://{user}:{password}@{rest}"
    return url


def fetch(url: str, accept: str | None = None) -> tuple[str, str]:
    """(Content-Type, body) of one scrape (with the URL's credentials, if it has some)."""
    headers = {"Accept": accept} if accept else {}
    parts = urlsplit(url)
    if parts.username is not None:
        token = base64.b64encode(f"{parts.username}:{parts.password}".encode()).decode()
        headers["Authorization"] = f"Basic {token}"
        netloc = parts.netloc.rpartition("@")[2]
        url = urlunsplit(parts._replace(netloc=netloc))
    with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=10) as r:
        return r.headers["Content-Type"], r.read().decode()


def families(url: str) -> dict[str, Metric]:
    """The page parsed by prometheus_client's Prometheus text parser, by family name."""
    out: dict[str, Metric] = {}
    for f in text_string_to_metric_families(fetch(url)[1]):
        assert f.name not in out, f"family {f.name} appears twice"
        out[f.name] = f
    return out


def openmetrics(url: str) -> dict[str, Metric]:
    ctype, text = fetch(url, OPENMETRICS_ACCEPT)
    assert ctype.startswith("application/openmetrics-text; version=1.0.0"), ctype
    return {f.name: f for f in openmetrics_families(text)}


def value(fams: dict[str, Metric], sample_name: str, **labels: str) -> float:
    """The one sample of that name and labels; 0 when there is none (a counter not yet
    counted)."""
    family = sample_name
    for suffix in ("_total", "_bucket", "_sum", "_count"):
        if family not in fams and family.endswith(suffix):
            family = family[:-len(suffix)]
    found = [s.value for s in fams[family].samples if s.name == sample_name
             and s.labels == labels] if family in fams else []
    assert len(found) <= 1, (sample_name, labels, found)
    return found[0] if found else 0.0


def sample_names(fams: dict[str, Metric]) -> set[str]:
    return {s.name for f in fams.values() for s in f.samples}


__all__ = ["families", "fetch", "metrics_url", "openmetrics", "openmetrics_families",
           "sample_names", "value"]
