"""The console's pages, rendered from the broker's state on its loop (read only).

Each function takes the broker, the viewer (what the principal may Describe) and what the
request asked, and returns (title, body). A broker shows what it knows: the partitions it hosts
(offsets, open transactions), the groups and transactional ids it coordinates, and the whole
cluster's metadata (brokers, leaders) from its view. In a cluster, each broker's console shows
its own share of the partitions, groups and transactions.
"""

from __future__ import annotations

import time

from ...group.coordinator import Member
from ...security.acls import ResourceType
from ...txn.state import TransactionMetadata, TransactionState
from ..clock import now_ms
from ..group_lag import group_lags
from ..stable_offsets import LsoHolder, coordinated_by_producer_id, holder
from ..topics import SHOWN_INTERNAL
from .chart import offsets_chart
from .layout import Html, age, esc, link, path_part, table

MAX_ROWS = 500  # per table: a page must stay small whatever the broker holds
MAX_DETAILED = 100  # partitions with a large chart on a topic's page

OPEN_STATES = (TransactionState.ONGOING, TransactionState.PREPARE_COMMIT,
               TransactionState.PREPARE_ABORT, TransactionState.PREPARE_EPOCH_FENCE)


def _capped(rows: list, what: str) -> tuple[list, str]:
    if len(rows) <= MAX_ROWS:
        return rows, ""
    return rows[:MAX_ROWS], f'<p class="note">{len(rows) - MAX_ROWS} more {esc(what)} not shown</p>'


def _partitions(broker, viewer, internal: bool):
    """(topic, index, rows still wanted) of every partition shown, the count of those over the
    cap last (so a page builds at most MAX_ROWS rows, however many partitions there are)."""
    shown = 0
    for name in _topic_names(broker, viewer, internal):
        for index in _partition_indexes(broker, name):
            yield name, index, shown < MAX_ROWS
            shown += 1


def _more(total: int, what: str) -> str:
    if total <= MAX_ROWS:
        return ""
    return (f'<p class="note">{total - MAX_ROWS} more {esc(what)} not shown (the first '
            f"{MAX_ROWS} are)</p>")


def _topic_names(broker, viewer, internal: bool) -> list[str]:
    view = broker.metadata.view
    names = set(view.topics) if view is not None else set(broker.topics.topics)
    return sorted(n for n in names if (internal or n not in SHOWN_INTERNAL)
                  and viewer.may_see(ResourceType.TOPIC, n))


def _partition_indexes(broker, name: str) -> list[int]:
    view = broker.metadata.view
    if view is not None and name in view.topics:
        return sorted(view.topics[name].partitions)
    topic = broker.topics.get(name)
    return sorted(p.index for p in topic.partitions) if topic is not None else []


def _leadership(broker, name: str, index: int) -> tuple[object, object, object]:
    """(leader, replicas, ISR) from the cluster's view."""
    view = broker.metadata.view
    if view is None or name not in view.topics:
        return None, None, None
    replicas = view.topics[name].partitions.get(index, ())
    state = view.states.get((name, index))
    if state is None:
        return None, ",".join(map(str, replicas)), None
    lai = state[0]
    leader = lai.leader if lai.has_leader else "none"
    return leader, ",".join(map(str, replicas)), ",".join(map(str, lai.isr))


def _open_txns(plog) -> list:
    return [e for e in plog.producer_state.producers.values() if e.current_txn_first_offset >= 0]


def _holder_name(h: LsoHolder) -> str:
    """The transaction holding an LSO as an operator names it: its transactional id when this
    broker coordinates it, else its producer id."""
    if h.transactional_id is not None:
        return f"{h.transactional_id} (producer {h.producer_id})"
    return f"producer {h.producer_id}"


def _holder_attrs(h: LsoHolder | None) -> dict[str, object]:
    if h is None:
        return {}
    return {"data-held-by": h.transactional_id if h.transactional_id is not None
            else f"producer {h.producer_id}", "data-stuck-ms": h.stuck_ms}


def _utc(ms: int) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(ms / 1000))


def _held_text(h: LsoHolder, now: int) -> str:
    """held by app-1 (producer 1000, Ongoing, open since 2026-11-29 06:01:02 UTC (5 min 12 s))
    (HTML)"""
    what = [f"producer {h.producer_id}"]
    if h.state is not None:
        what.append(h.state)
    if h.two_phase:
        what.append("two-phase commit")
    if h.txn_start_ms is not None:
        what.append(f"open since {_utc(h.txn_start_ms)} ({age(now - h.txn_start_ms)})")
    elif h.first_write_ms is not None:
        what.append(f"first write {_utc(h.first_write_ms)} ({age(now - h.first_write_ms)} ago)")
    who = esc(h.transactional_id) if h.transactional_id is not None else \
        "a transaction not coordinated by this broker"
    return f"held by {who} ({esc(', '.join(what))})"


# -- topics ----------------------------------------------------------------------------------

def _partition_row(broker, sampler, name: str, index: int, by_pid: dict
                   ) -> tuple[dict[str, object], list]:
    leader, replicas, isr = _leadership(broker, name, index)
    row_attrs: dict[str, object] = {"data-topic": name, "data-partition": index}
    topic_link = link(f"/topics/{path_part(name)}", name)
    p = broker.topics.partition(name, index)
    if p is None:
        return row_attrs, [topic_link, index, leader, replicas, isr, "not hosted here", None,
                           None, None, None, None]
    plog = p.log
    start, hw, lso = plog.log_start_offset, plog.high_watermark, plog.last_stable_offset
    open_txns = len(_open_txns(plog))
    row_attrs.update({"data-log-start": start, "data-hw": hw, "data-lso": lso,
                      "data-open-transactions": open_txns})
    behind: object = "0"
    if lso < hw:
        row_attrs["class"] = "stuck"
        h = holder(broker.lso_watch, p, now_ms(), by_pid)
        row_attrs.update(_holder_attrs(h))
        held = (f" {esc(_holder_name(h))}, stuck for {age(h.stuck_ms)}" if h is not None
                else "")
        behind = Html(f'<span class="badge warn">{hw - lso} behind</span>{held}')
    history, last_seen = sampler.history(name, index)
    chart = Html(offsets_chart(history, last_seen, sampler.window_s, label=f"{name}-{index}"))
    return row_attrs, [topic_link, index, leader, replicas, isr, start, lso, hw, behind,
                       open_txns, chart]


def topics_page(broker, sampler, viewer, internal: bool = False) -> tuple[str, str]:
    rows = []
    total = 0
    by_pid = coordinated_by_producer_id(broker.txn_coordinator.all_cores())
    for name, index, wanted in _partitions(broker, viewer, internal):
        total += 1
        if wanted:
            rows.append(_partition_row(broker, sampler, name, index, by_pid))
    more = _more(total, "partitions")
    body = (
        '<p class="note">Per partition: the log start offset, the last stable offset (LSO: '
        "what read_committed consumers may read up to) and the high watermark (HW), and both "
        f"over the last {int(sampler.window_s)} s: the solid line is the HW, the dashed one "
        "the LSO. An LSO flat under a climbing HW is a transaction left open. "
        + ('<a href="/topics">hide internal topics</a>' if internal
           else '<a href="/topics?internal=1">show internal topics</a>') + "</p>"
        + table(["Topic", "Partition", "Leader", "Replicas", "ISR", "Log start", "LSO", "HW",
                 "HW - LSO", "Open txns", "HW / LSO"], rows, css="partitions",
                empty="no topics") + more)
    return "Topics", body


def topic_page(broker, sampler, viewer, name: str) -> tuple[str, str] | None:
    if name not in _topic_names(broker, viewer, internal=True):
        return None
    now = now_ms()
    parts = []
    by_pid = coordinated_by_producer_id(broker.txn_coordinator.all_cores())
    indexes = _partition_indexes(broker, name)
    for index in indexes[:MAX_DETAILED]:
        leader, replicas, isr = _leadership(broker, name, index)
        p = broker.topics.partition(name, index)
        head = (f"<h2>Partition {index}</h2><p>leader {esc(leader)}, replicas "
                f"{esc(replicas)}, ISR {esc(isr)}</p>")
        if p is None:
            parts.append(head + '<p class="note">not hosted on this broker</p>')
            continue
        plog = p.log
        history, last_seen = sampler.history(name, index)
        figures = table(["Log start", "LSO", "HW", "Log end"], [({}, [
            plog.log_start_offset, plog.last_stable_offset, plog.high_watermark,
            plog.log_end_offset])])
        chart = offsets_chart(history, last_seen, sampler.window_s, width=720,
                              height=180, axes=True, label=f"{name}-{index}")
        txns = table(["Producer id", "Transactional id", "Epoch", "First offset", "Last write"],
                     [({"data-producer-id": e.producer_id},
                       [e.producer_id, by_pid[e.producer_id].transactional_id
                        if e.producer_id in by_pid else None, e.producer_epoch,
                        e.current_txn_first_offset,
                        f"{age(now - e.last_timestamp)} ago" if e.last_timestamp >= 0 else None])
                      for e in _open_txns(plog)], empty="no open transactions")
        h = holder(broker.lso_watch, p, now, by_pid)
        stuck = ""
        if h is not None:
            attrs = "".join(f' {k}="{esc(v)}"' for k, v in _holder_attrs(h).items())
            stuck = (f'<p class="stuck-note"{attrs}><span class="badge warn">LSO stuck at '
                     f"{h.lso} for {age(h.stuck_ms)}</span> {h.hw - h.lso} records past it, "
                     f"{_held_text(h, now)}: read_committed consumers wait there</p>")
        parts.append(head + figures + stuck + chart + "<h3>Open transactions</h3>" + txns)
    if len(indexes) > MAX_DETAILED:
        parts.append(f'<p class="note">partitions {MAX_DETAILED} to {len(indexes) - 1} not '
                     "shown: the Topics page lists them</p>")
    return f"Topic {name}", "".join(parts)


# -- transactions ----------------------------------------------------------------------------

def _coordinator_transactions(broker, viewer) -> list[tuple[int, TransactionMetadata]]:
    out = []
    for index, core in sorted(broker.txn_coordinator.runtime.shards.items()):
        for m in core.transactions.values():
            if viewer.may_see(ResourceType.TRANSACTIONAL_ID, m.transactional_id):
                out.append((index, m))
    return out


def transactions_page(broker, viewer, show_all: bool = False) -> tuple[str, str]:
    now = now_ms()
    max_timeout = broker.config.int("transaction.max.timeout.ms")
    warn_2pc = broker.config.int("console.two.phase.commit.warn.ms")
    coordinated = _coordinator_transactions(broker, viewer)
    by_pid: dict[int, TransactionMetadata] = {}
    for _index, m in coordinated:
        by_pid[m.producer_id] = m

    rows = []
    listed = [(i, m) for i, m in coordinated if show_all or m.state in OPEN_STATES]
    listed.sort(key=lambda im: (im[1].state not in OPEN_STATES, im[1].txn_start_ms
                                if im[1].txn_start_ms >= 0 else now, im[1].transactional_id))
    for index, m in listed:
        is_open = m.state in OPEN_STATES
        open_ms = now - m.txn_start_ms if is_open and m.txn_start_ms >= 0 else None
        late = open_ms is not None and not m.two_phase and open_ms > m.txn_timeout_ms
        # KIP-939: a two-phase-commit transaction never times out; one open long holds the
        # LSO of its partitions until its external transaction manager decides it
        long_2pc = open_ms is not None and m.two_phase and open_ms > warn_2pc
        parts = ", ".join(f"{t}-{p}" for t, p in sorted(m.partitions))
        state = Html(f'<span class="badge">{esc(m.state.display)}</span>' + (
            ' <span class="badge bad">two-phase commit open long</span>' if long_2pc else ""))
        rows.append(({"data-transactional-id": m.transactional_id, "data-state": m.state.display,
                      "data-two-phase": "yes" if m.two_phase else "no",
                      "class": "hanging" if late else "two-phase-long" if long_2pc else ""},
                     [m.transactional_id, m.producer_id, m.producer_epoch, state,
                      age(open_ms) if open_ms is not None else None,
                      "none (two-phase commit)" if m.two_phase else age(m.txn_timeout_ms),
                      f"{age(now - m.txn_last_update_ms)} ago" if m.txn_last_update_ms >= 0
                      else None, parts or None, index]))
    rows, more = _capped(rows, "transactional ids")
    coordinator_side = table(
        ["Transactional id", "Producer id", "Epoch", "State", "Open for", "Timeout",
         "Last update", "Partitions", "Coordinator partition"], rows, css="coordinator",
        empty="no open transactions coordinated here")

    # The partitions' side: every transaction a partition holds open, checked against the
    # coordinator as Kafka's ``kafka-transactions find-hanging`` does: open longer than
    # transaction.max.timeout.ms and the coordinator does not have it open on the partition.
    all_here = len(broker.txn_coordinator.runtime.shards) == (
        broker.txn_coordinator.runtime.partition_count() or -1)
    prow = []
    for p in broker.topics.all_partitions():
        if not viewer.may_see(ResourceType.TOPIC, p.topic):
            continue
        for e in _open_txns(p.log):
            owner = by_pid.get(e.producer_id)
            since = now - e.last_timestamp if e.last_timestamp >= 0 else None
            if owner is not None:
                known = (owner.state in OPEN_STATES
                         and (p.topic, p.index) in owner.partitions)
                coordinator = f"{owner.transactional_id} ({owner.state.display})"
            else:
                known = False
                coordinator = "unknown to the coordinator" if all_here \
                    else "coordinated by another broker"
            hanging = (since is not None and since > max_timeout and not known
                       and (owner is not None or all_here))
            prow.append(({"data-topic": p.topic, "data-partition": p.index,
                          "data-producer-id": e.producer_id,
                          "data-hanging": "yes" if hanging else "no",
                          "class": "hanging" if hanging else ""},
                         [link(f"/topics/{path_part(p.topic)}", p.topic), p.index,
                          e.producer_id, e.producer_epoch, e.current_txn_first_offset,
                          f"{age(since)} ago" if since is not None else None, coordinator,
                          Html('<span class="badge bad">hanging</span>') if hanging else "no"]))
    prow, pmore = _capped(prow, "open transactions")
    partition_side = table(
        ["Topic", "Partition", "Producer id", "Epoch", "First offset", "Last write",
         "Coordinator", "Hanging"], prow, css="partition-side",
        empty="no partition hosted here holds a transaction open")
    toggle = ('<a href="/transactions">only open ones</a>' if show_all
              else '<a href="/transactions?all=1">all transactional ids</a>')
    body = (f"<h2>At the coordinator</h2><p class=\"note\">The transactional ids this broker "
            f"coordinates ({toggle}). A row is marked when its transaction is open longer than "
            "its timeout, or, for a two-phase-commit transaction (KIP-939), which never times "
            "out and holds its partitions' last stable offset until its transaction manager "
            f"decides it, open longer than console.two.phase.commit.warn.ms ({age(warn_2pc)})."
            "</p>" + coordinator_side + more
            + "<h2>In the partitions</h2><p class=\"note\">Transactions the partitions hosted "
            "here hold open (their producer state), with the coordinator's view. Hanging: "
            f"open for over transaction.max.timeout.ms ({age(max_timeout)}) while the "
            "coordinator does not have it open on the partition, as <code>kafka-transactions "
            "find-hanging</code> reports; abort one with <code>oncelog transactions "
            "abort</code>.</p>" + partition_side + pmore)
    return "Transactions", body


# -- groups ----------------------------------------------------------------------------------

def _assignments(group) -> dict[tuple[str, int], Member]:
    """(topic, partition) -> the member it is assigned to, for the consumer protocol."""
    from ...protocol import ProtocolError
    from ...protocol.consumer_protocol import read_assignment

    out: dict[tuple[str, int], Member] = {}
    if group.protocol_type != "consumer":
        return out
    for member in group.members.values():
        if not member.assignment:
            continue
        try:
            assignment = read_assignment(member.assignment)
        except ProtocolError:
            continue
        for t in assignment.assigned_partitions:
            for index in t.partitions:
                out[(t.topic, index)] = member
    return out


def _lag_holder(broker, e, now: int, by_pid: dict) -> LsoHolder | None:
    """The open transaction holding a group's lag on a partition hosted here: the group has
    committed at or past the LSO and the LSO is under the HW."""
    if e.committed_offset is None or not e.lag:
        return None
    p = broker.topics.partition(e.topic, e.partition)
    if p is None or e.committed_offset < p.log.last_stable_offset:
        return None
    return holder(broker.lso_watch, p, now, by_pid)


def groups_page(broker, viewer) -> tuple[str, str]:
    groups = broker.group_coordinator.groups()
    names = sorted(g for g in groups if viewer.may_see(ResourceType.GROUP, g))
    names, more = _capped(names, "groups")
    lags: dict[str, list] = {}
    now = now_ms()
    by_pid = coordinated_by_producer_id(broker.txn_coordinator.all_cores())
    for entry in group_lags(groups, broker.topics, names):
        lags.setdefault(entry.group_id, []).append(entry)
    parts = []
    for name in names:
        g = groups[name]
        owner = _assignments(g)
        total = sum(e.lag for e in lags.get(name, ()) if e.lag is not None)
        parts.append(
            f'<section class="group" data-group="{esc(name)}"><h2>{esc(name)}</h2>'
            f'<p><span class="badge">{esc(g.state.value)}</span> protocol type '
            f"{esc(g.protocol_type)}, assignor {esc(g.protocol)}, generation {g.generation}, "
            f"{len(g.members)} member{'' if len(g.members) == 1 else 's'}, total lag {total}</p>")
        parts.append(table(
            ["Member id", "Group instance id", "Client id", "Host"],
            [({"data-group": name, "data-member-id": m.member_id},
              [m.member_id, m.group_instance_id, m.client_id, m.client_host])
             for m in g.members.values()], empty="no members"))
        rows = []
        held = []
        for e in lags.get(name, ()):
            if not viewer.may_see(ResourceType.TOPIC, e.topic):
                continue
            m = owner.get((e.topic, e.partition))
            h = _lag_holder(broker, e, now, by_pid)
            if h is not None:
                attrs = "".join(f' {k}="{esc(v)}"' for k, v in _holder_attrs(h).items())
                held.append(f'<li class="held" data-group="{esc(name)}" data-topic='
                            f'"{esc(e.topic)}" data-partition="{e.partition}"{attrs}>'
                            f"{esc(e.topic)}-{e.partition}: lag {e.lag} {_held_text(h, now)}, "
                            f"the LSO stuck at {h.lso} for {age(h.stuck_ms)}</li>")
            rows.append(({"data-group": name, "data-topic": e.topic,
                          "data-partition": e.partition, "data-lag": e.lag,
                          "data-consumer-id": m.member_id if m else "",
                          "class": "stuck" if h is not None else ""}, [
                e.topic, e.partition, e.committed_offset, e.log_end_offset, e.lag,
                m.member_id if m else None, m.client_host if m else None,
                m.client_id if m else None]))
        # Kafka's kafka-consumer-groups --describe columns
        parts.append(table(["TOPIC", "PARTITION", "CURRENT-OFFSET", "LOG-END-OFFSET", "LAG",
                            "CONSUMER-ID", "HOST", "CLIENT-ID"], rows, css="lag",
                           empty="no committed offsets"))
        if held:
            parts.append('<p class="note">Lag held by an open transaction: the group has '
                         "committed up to the last stable offset, which read_committed "
                         'consumers cannot pass until the transaction ends.</p><ul class="held">'
                         + "".join(held) + "</ul>")
        parts.append("</section>")
    if not names:
        parts.append('<p class="empty">no groups coordinated by this broker</p>')
    note = ('<p class="note">The groups this broker coordinates. LAG is the log end offset '
            "(the partition's high watermark) minus the committed offset, as "
            "<code>kafka-consumer-groups --describe</code> computes it; - where the partition "
            "is not hosted on this broker.</p>")
    return "Consumer groups", note + "".join(parts) + more


# -- brokers ---------------------------------------------------------------------------------

def brokers_page(broker, viewer, internal: bool = False) -> tuple[str, str]:
    view = broker.metadata.view
    if view is None:
        return "Brokers", '<p class="empty">this broker has not joined its cluster yet</p>'
    rows = []
    for node_id, b in sorted(view.brokers.items()):
        roles = []
        if node_id == view.controller_id:
            roles.append("controller")
        if node_id == broker.node_id:
            roles.append("this broker")
        rows.append(({"data-node-id": node_id}, [node_id, f"{b.host}:{b.port}", b.rack,
                                                  ", ".join(roles) or None]))
    brokers = table(["Id", "Address", "Rack", "Role"], rows, css="brokers")
    leaders = []
    total = 0
    for name, index, wanted in _partitions(broker, viewer, internal):
        total += 1
        if wanted:
            leader, replicas, isr = _leadership(broker, name, index)
            offline = leader in (None, "none")
            leaders.append(({"data-topic": name, "data-partition": index,
                             "data-leader": leader, "data-replicas": replicas, "data-isr": isr,
                             "class": "offline" if offline else ""},
                            [link(f"/topics/{path_part(name)}", name), index, leader,
                             replicas, isr]))
    more = _more(total, "partitions")
    toggle = ('<a href="/brokers">hide internal topics</a>' if internal
              else '<a href="/brokers?internal=1">show internal topics</a>')
    body = (f"<p>cluster {esc(broker.cluster_id)}, controller {esc(view.controller_id)}</p>"
            + brokers + f"<h2>Partition leaders</h2><p class=\"note\">{toggle}</p>"
            + table(["Topic", "Partition", "Leader", "Replicas", "ISR"], leaders,
                    css="leaders", empty="no topics") + more)
    return "Brokers", body
