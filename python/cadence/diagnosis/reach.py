"""Can a host be reached at all? One TCP connection to an address it
listened on at set-up: accepted or refused, its kernel answered (the host
is up and the path works, whatever its processes do); no answer within the
timeout, or no route, and it is unreachable from here.

The live diagnosis asks this of hosts none of whose ranks answered a round
(unreachable.py), and a rank that lost the Store asks it of the Store's host
and the hosts it waits on, to say which side of a cut it is on. A host
behind a firewall that drops connections to closed ports looks unreachable;
the verdict says what was probed.

Probes run in threads of their own, at most MAX_PROBES hosts per question
(a per-rank cost that does not grow with the job), each bounded by its
timeout.
"""

from __future__ import annotations

import errno
import socket
import threading

#: Seconds a probe waits for the host's kernel to answer. Between hosts of
#: one cluster a SYN is answered in well under a millisecond; a second
#: leaves room for a loaded host.
PROBE_TIMEOUT_S = 1.0
#: Hosts probed per question, at most.
MAX_PROBES = 8

#: Errors that mean "no answer from that host", as a timeout does.
_UNREACHABLE = {errno.EHOSTUNREACH, errno.ENETUNREACH, errno.ETIMEDOUT, errno.EHOSTDOWN,
                errno.ENETDOWN}


def probe(addr: str, timeout: float = PROBE_TIMEOUT_S) -> bool | None:
    """True: `addr` (`ip:port`) answered; False: it did not; None: the
    address cannot be probed (malformed, or a local error)."""
    host, _, port = addr.rpartition(":")
    try:
        target = (host.strip("[]"), int(port))
    except ValueError:
        return None
    try:
        with socket.create_connection(target, timeout=timeout):
            return True
    except ConnectionRefusedError:
        return True
    except TimeoutError:
        return False
    except OSError as e:
        return False if e.errno in _UNREACHABLE else None


def probe_hosts(addrs: dict[str, str], timeout: float = PROBE_TIMEOUT_S
                ) -> dict[str, bool | None]:
    """Probes every host of `addrs` (host → `ip:port`, at most MAX_PROBES of
    them, in the order given) at once; host → probe()."""
    out: dict[str, bool | None] = {}
    picked = list(addrs.items())[:MAX_PROBES]

    def one(h: str, a: str) -> None:
        out[h] = probe(a, timeout)

    threads = [threading.Thread(target=one, args=hv, daemon=True) for hv in picked]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout + 1.0)
    return {h: out.get(h) for h, _ in picked}


def host_addrs(peers: list[dict]) -> dict[str, str]:
    """host → the set-up address of its first rank (a dump's `peers`)."""
    out: dict[str, str] = {}
    for p in peers:
        if p.get("addr"):
            out.setdefault(str(p.get("host")), str(p["addr"]))
    return out


def probe_silent(peers: list[dict], answered) -> dict[str, bool | None] | None:
    """A live round's probes of the hosts none of whose ranks answered
    (unreachable.py); None when every host had a rank answer."""
    from cadence.diagnosis.unreachable import silent_hosts

    host_of = {int(p["rank"]): str(p["host"]) for p in peers}
    heard = set(answered)
    silent, _answered = silent_hosts(host_of, [r for r in host_of if r not in heard])
    if not silent:
        return None
    addrs = host_addrs(peers)
    return probe_hosts({h: addrs[h] for h in silent if h in addrs})
