"""Prometheus metrics of every live communicator of this process.

    CADENCE_METRICS_PORT=9400 torchrun ...   # rank with local rank i serves :9400+i/metrics

`CADENCE_METRICS_PORT=p`: the first communicator created in a process starts
an HTTP server (prometheus_client's) on port p + its local rank (its index
among the ranks of its host, so ranks on one host never collide), bound to
`CADENCE_METRICS_ADDR` (default 0.0.0.0: Prometheus scrapes from another
machine; the endpoint is read-only). Every scrape reads each live
communicator's native totals (`metrics()`: a lock the operations take for a
few adds, and the links' counters) — nothing runs on the collective path in
Python. Metrics and labels: docs/diagnosis.md, "Metrics (Prometheus)".

Link series are per peer host and path by default (a rank's series grow
with the hosts it talks to, not with the job); `CADENCE_METRICS_PEERS=1`
adds one series per peer rank and path as well.

Without the variable nothing is started and prometheus_client is not
imported; `register(registry)` adds the collector to a registry an
application serves itself. The live watcher reports verdicts through
`set_verdict(comm_id, cls, headline)`.
"""

from __future__ import annotations

import json
import os
import threading
import time
import weakref

from cadence.diagnosis.verdict import VerdictClass

PORT_VAR = "CADENCE_METRICS_PORT"
ADDR_VAR = "CADENCE_METRICS_ADDR"
PEERS_VAR = "CADENCE_METRICS_PEERS"
DEFAULT_ADDR = "0.0.0.0"
PACKAGE = "prometheus_client"

# Every class a verdict can have; cadence_verdict has one series per class
# (1 for the current one), so a change of verdict is a change of value, not
# a series that appears.
VERDICT_CLASSES = (VerdictClass.HEALTHY, VerdictClass.COMM_HANG, VerdictClass.NONCOMM_HANG,
                   VerdictClass.COMM_SLOW, VerdictClass.NONCOMM_SLOW, VerdictClass.MISMATCH)

_lock = threading.Lock()
# Live communicators (weakly: a communicator the application dropped is
# not kept alive, and its series disappear).
_comms: weakref.WeakSet = weakref.WeakSet()
# comm id -> (class, headline, unix time it was set)
_verdicts: dict[str, tuple[str, str, float]] = {}
_server = None  # (httpd, thread, addr, port) once started
_registered = False


class MetricsError(RuntimeError):
    """CADENCE_METRICS_PORT is set but the metrics cannot be served."""


def track(comm) -> None:
    """Called by every new Communicator: remembers it (weakly) and, when
    CADENCE_METRICS_PORT is set and no server runs yet in this process,
    starts one. Raises MetricsError with the reason when that fails."""
    with _lock:
        _comms.add(comm)
    raw = os.environ.get(PORT_VAR)
    if raw and _server is None:
        start_server(raw, comm.local_rank)


def set_verdict(comm_id: str, cls: str, headline: str = "") -> None:
    """Sets communicator `comm_id`'s current verdict (`healthy` until set)."""
    with _lock:
        _verdicts[comm_id] = (cls, headline, time.time())


def verdict(comm_id: str) -> tuple[str, str]:
    """The current verdict of `comm_id` as (class, headline)."""
    with _lock:
        cls, headline, _ = _verdicts.get(comm_id, (VerdictClass.HEALTHY, "", 0.0))
    return cls, headline


def _prometheus():
    try:
        import prometheus_client
    except ImportError:
        raise MetricsError(
            f"{PORT_VAR} is set but the Python package {PACKAGE} is not installed "
            f"(pip install {PACKAGE}, or cadence[metrics]); unset {PORT_VAR} to run without "
            "metrics"
        ) from None
    return prometheus_client


def start_server(port_spec: str | int, local_rank: int = 0, addr: str | None = None):
    """Serves the metrics on port `port_spec + local_rank` (what
    CADENCE_METRICS_PORT does); returns (addr, port). Raises MetricsError
    when the port is not a number, is taken, or prometheus_client is
    missing."""
    global _server
    try:
        base = int(port_spec)
    except ValueError:
        raise MetricsError(f"{PORT_VAR}={port_spec!r} is not a port number") from None
    port = base + local_rank
    if not 0 < port < 65536:
        raise MetricsError(
            f"{PORT_VAR}={base}: port {port} (= {base} + local rank {local_rank}) is out of range"
        )
    addr = addr or os.environ.get(ADDR_VAR) or DEFAULT_ADDR
    prom = _prometheus()
    with _lock:
        if _server is not None:
            return _server[2], _server[3]
        register(prom.REGISTRY)
        try:
            httpd, thread = prom.start_http_server(port, addr=addr)
        except OSError as e:
            taken = e.errno in (98, 48)  # EADDRINUSE (Linux, macOS)
            why = "is already in use" if taken else f"cannot be opened ({e.strerror or e})"
            raise MetricsError(
                f"{PORT_VAR}={base}: port {port} (= {base} + local rank {local_rank}) on "
                f"{addr} {why}; choose another {PORT_VAR} (ranks of a host use "
                f"{PORT_VAR} + 0, 1, ...)"
            ) from None
        _server = (httpd, thread, addr, port)
    return addr, port


def register(registry=None) -> None:
    """Adds the cadence collector to `registry` (default: prometheus_client's
    global one), for an application that serves its own metrics. Once per
    process for the global registry."""
    global _registered
    prom = _prometheus()
    if registry is None or registry is prom.REGISTRY:
        if _registered:
            return
        _registered = True
        registry = prom.REGISTRY
    registry.register(Collector())


def snapshot(comm) -> dict:
    """One communicator's native totals as a dict (the JSON `metrics()`
    returns; format in docs/diagnosis.md)."""
    core = getattr(comm, "_c", comm)
    return json.loads(core.metrics())


def _live() -> list:
    with _lock:
        return list(_comms)


def _per_peer() -> bool:
    """Whether series per peer rank are asked for (CADENCE_METRICS_PEERS)."""
    return os.environ.get(PEERS_VAR, "").strip() not in ("", "0")


def _by_host(links: list) -> tuple[dict, dict]:
    """The links' totals summed per (peer host, transport), and their paths'
    per (peer host, path): what the default series show."""
    hosts: dict = {}
    paths: dict = {}
    for link in links:
        h = hosts.setdefault((link["peer_host"], link["transport"]),
                             {"links": 0, "bytes_sent": 0, "bytes_recv": 0, "msgs_sent": 0,
                              "msgs_recv": 0, "busy_ns": 0})
        h["links"] += 1
        for k in ("bytes_sent", "bytes_recv", "msgs_sent", "msgs_recv", "busy_ns"):
            h[k] += link[k]
        for k, path in enumerate(link.get("paths", [])):
            p = paths.setdefault((link["peer_host"], k),
                                 {"bytes_sent": 0, "bytes_recv": 0, "rate_bps": 0, "down": 0,
                                  "downs": 0, "resent_bytes": 0})
            for key in ("bytes_sent", "bytes_recv", "rate_bps", "resent_bytes"):
                p[key] += path.get(key, 0)
            p["downs"] += path.get("downs", 0)
            p["down"] += 0 if path.get("up", True) else 1
    return hosts, paths


class Collector:
    """Reads every live communicator's totals at scrape time."""

    def describe(self):
        # Names and types without reading anything (checked for clashes at
        # registration).
        return list(_families().values())

    def collect(self):
        from prometheus_client.utils import floatToGoString

        fam = _families()
        per_peer = _per_peer()
        if not per_peer:
            for name in _PEER_FAMILIES:
                del fam[name]
        for comm in _live():
            try:
                m = snapshot(comm)
            except Exception:  # noqa: BLE001 - one broken communicator must not end the scrape
                continue
            base = [m["comm_id"], str(m["rank"]), m["host"]]
            fam["info"].add_metric(base, {"cadence_job": m["job"], "nranks": str(m["nranks"])})
            for c in m["collectives"]:
                kind = [*base, c["collective"]]
                fam["ops"].add_metric([*kind, "ok"], c["ok"])
                fam["ops"].add_metric([*kind, "failed"], c["failed"])
                fam["bytes"].add_metric(kind, c["bytes"])
                cumulative, buckets = 0, []
                for bound_ns, n in zip(m["bucket_bounds_ns"], c["buckets"], strict=False):
                    cumulative += n
                    buckets.append((floatToGoString(bound_ns / 1e9), cumulative))
                buckets.append(("+Inf", c["ok"]))
                fam["seconds"].add_metric(kind, buckets, c["duration_ns"] / 1e9)
            hosts, paths = _by_host(m["links"])
            for (peer_host, tr), h in hosts.items():
                at = [*base, peer_host]
                fam["host_links"].add_metric([*at, tr], h["links"])
                fam["host_bytes"].add_metric([*at, "send", tr], h["bytes_sent"])
                fam["host_bytes"].add_metric([*at, "recv", tr], h["bytes_recv"])
                fam["host_msgs"].add_metric([*at, "send", tr], h["msgs_sent"])
                fam["host_msgs"].add_metric([*at, "recv", tr], h["msgs_recv"])
                fam["host_busy"].add_metric([*at, tr], h["busy_ns"] / 1e9)
            for (peer_host, k), p in paths.items():
                at = [*base, peer_host, str(k)]
                fam["host_path_bytes"].add_metric([*at, "send"], p["bytes_sent"])
                fam["host_path_bytes"].add_metric([*at, "recv"], p["bytes_recv"])
                fam["host_path_rate"].add_metric(at, p["rate_bps"])
                fam["host_path_down"].add_metric(at, p["down"])
                fam["host_path_downs"].add_metric(at, p["downs"])
                fam["host_path_resent"].add_metric(at, p["resent_bytes"])
            for link in m["links"] if per_peer else ():
                peer = [*base, str(link["peer"]), link["peer_host"]]
                tr = link["transport"]
                fam["peer_bytes"].add_metric([*peer, "send", tr], link["bytes_sent"])
                fam["peer_bytes"].add_metric([*peer, "recv", tr], link["bytes_recv"])
                fam["peer_msgs"].add_metric([*peer, "send", tr], link["msgs_sent"])
                fam["peer_msgs"].add_metric([*peer, "recv", tr], link["msgs_recv"])
                busy = link["busy_ns"] / 1e9
                fam["peer_busy"].add_metric([*peer, tr], busy)
                if busy > 0:
                    moved = link["bytes_sent"] + link["bytes_recv"]
                    fam["peer_rate"].add_metric(peer, moved / busy)
                for k, path in enumerate(link.get("paths", [])):
                    fam["path_bytes"].add_metric([*peer, str(k), "send"], path["bytes_sent"])
                    fam["path_bytes"].add_metric([*peer, str(k), "recv"], path["bytes_recv"])
                    fam["path_rate"].add_metric([*peer, str(k)], path["rate_bps"])
                    fam["path_up"].add_metric([*peer, str(k)], 1.0 if path.get("up", True) else 0.0)
                    fam["path_downs"].add_metric([*peer, str(k)], path.get("downs", 0))
                    fam["path_resent"].add_metric([*peer, str(k)], path.get("resent_bytes", 0))
            running = m["running"]
            fam["running"].add_metric(
                base, 0.0 if running is None else (m["now_ns"] - running["start_ns"]) / 1e9
            )
            cls, _, _ = _verdicts.get(m["comm_id"], (VerdictClass.HEALTHY, "", 0.0))
            classes = VERDICT_CLASSES if cls in VERDICT_CLASSES else (*VERDICT_CLASSES, cls)
            for c in classes:
                fam["verdict"].add_metric([*base, c], 1.0 if c == cls else 0.0)
        yield from fam.values()


# The series per peer rank (CADENCE_METRICS_PEERS=1).
_PEER_FAMILIES = ("peer_bytes", "peer_msgs", "peer_busy", "peer_rate", "path_bytes", "path_rate",
                  "path_up", "path_downs", "path_resent")


def _families() -> dict:
    from prometheus_client.core import (
        CounterMetricFamily,
        GaugeMetricFamily,
        HistogramMetricFamily,
        InfoMetricFamily,
    )

    base = ["comm", "rank", "host"]
    peer = [*base, "peer", "peer_host"]
    host = [*base, "peer_host"]
    return {
        "info": InfoMetricFamily(
            "cadence_communicator", "A live communicator of this process", labels=base),
        "ops": CounterMetricFamily(
            "cadence_operations", "Operations finished, by collective and status (ok, failed)",
            labels=[*base, "collective", "status"]),
        "bytes": CounterMetricFamily(
            "cadence_bytes", "Bytes of completed operations (the call's size: the larger of "
            "input and output), by collective", labels=[*base, "collective"]),
        "seconds": HistogramMetricFamily(
            "cadence_operation_seconds", "Duration of completed operations (start to end), "
            "by collective", labels=[*base, "collective"]),
        "host_links": GaugeMetricFamily(
            "cadence_host_links", "Links this rank holds to ranks of a peer host",
            labels=[*host, "transport"]),
        "host_bytes": CounterMetricFamily(
            "cadence_host_bytes", "Bytes moved on the links to a peer host's ranks (payload), "
            "by direction", labels=[*host, "direction", "transport"]),
        "host_msgs": CounterMetricFamily(
            "cadence_host_messages", "Messages completed on the links to a peer host's ranks, "
            "by direction", labels=[*host, "direction", "transport"]),
        "host_busy": CounterMetricFamily(
            "cadence_host_busy_seconds", "Time the links to a peer host's ranks had a transfer "
            "pending, summed over the links", labels=[*host, "transport"]),
        "host_path_bytes": CounterMetricFamily(
            "cadence_host_path_bytes", "Bytes moved on path k (local NIC k to the peer's NIC k) "
            "of the TCP links to a peer host's ranks, by direction",
            labels=[*host, "path", "direction"]),
        "host_path_rate": GaugeMetricFamily(
            "cadence_host_path_rate_bytes_per_second", "Delivery rate of path k of the TCP "
            "links to a peer host's ranks as the senders measure it, summed over the links "
            "(0 until measured)", labels=[*host, "path"]),
        "host_path_down": GaugeMetricFamily(
            "cadence_host_path_down_links", "TCP links to a peer host's ranks whose path k is "
            "down (failed over to their other paths)", labels=[*host, "path"]),
        "host_path_downs": CounterMetricFamily(
            "cadence_host_path_downs", "Times path k of a TCP link to a peer host's ranks went "
            "down", labels=[*host, "path"]),
        "host_path_resent": CounterMetricFamily(
            "cadence_host_path_resent_bytes", "Payload bytes sent again on other paths because "
            "path k of a link to a peer host's ranks went down", labels=[*host, "path"]),
        "peer_bytes": CounterMetricFamily(
            "cadence_peer_bytes", "Bytes moved on the link to a peer (payload), by direction",
            labels=[*peer, "direction", "transport"]),
        "peer_msgs": CounterMetricFamily(
            "cadence_peer_messages", "Messages completed on the link to a peer, by direction",
            labels=[*peer, "direction", "transport"]),
        "peer_busy": CounterMetricFamily(
            "cadence_peer_busy_seconds", "Time the link to a peer had a transfer pending",
            labels=[*peer, "transport"]),
        "peer_rate": GaugeMetricFamily(
            "cadence_peer_rate_bytes_per_second", "Bytes moved on the link to a peer (both "
            "directions) over its busy time, since the communicator was created", labels=peer),
        "path_bytes": CounterMetricFamily(
            "cadence_path_bytes", "Bytes moved on one path (local NIC k to the peer's NIC k) "
            "of a TCP link, by direction", labels=[*peer, "path", "direction"]),
        "path_rate": GaugeMetricFamily(
            "cadence_path_rate_bytes_per_second", "Delivery rate of one path of a TCP link as "
            "the sender measures it (bytes over time while it had bytes queued, over about "
            "the last second of such time; 0 until measured)", labels=[*peer, "path"]),
        "path_up": GaugeMetricFamily(
            "cadence_path_up", "1 while one path of a TCP link carries chunks, 0 while it is "
            "down (failed over to the link's other paths)", labels=[*peer, "path"]),
        "path_downs": CounterMetricFamily(
            "cadence_path_downs", "Times one path of a TCP link went down",
            labels=[*peer, "path"]),
        "path_resent": CounterMetricFamily(
            "cadence_path_resent_bytes", "Payload bytes sent again on other paths because "
            "this path went down", labels=[*peer, "path"]),
        "running": GaugeMetricFamily(
            "cadence_running_operation_seconds", "How long the oldest operation still running "
            "has run (0: none)", labels=base),
        "verdict": GaugeMetricFamily(
            "cadence_verdict", "The current diagnosis: 1 for its class, 0 for the others",
            labels=[*base, "class"]),
    }
