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
