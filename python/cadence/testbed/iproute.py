"""Thin wrappers around iproute2's `ip` and `tc`: run one command, fail with
its stderr, read JSON. Everything here needs root (CAP_NET_ADMIN, and
CAP_SYS_ADMIN for `ip netns`)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess

ROOT_MESSAGE = "cadence cluster needs root (network namespaces); run as root or with sudo"
# Generous: one `ip` call takes milliseconds, but a loaded CI machine with
# many namespaces being torn down at once can stall netlink for seconds.
COMMAND_TIMEOUT = 60.0


class TestbedError(RuntimeError):
    """A cluster operation that could not be done, with a message for the user."""

    __test__ = False  # not a pytest test class, despite the name


def check_root() -> None:
    if os.geteuid() != 0:
        raise TestbedError(ROOT_MESSAGE)


def check_tools() -> None:
    missing = [tool for tool in ("ip", "tc") if shutil.which(tool) is None]
    if missing:
        raise TestbedError(
            f"cadence cluster needs iproute2 ({' and '.join(missing)} not found); "
            "install it with `apt-get install iproute2`"
        )


def run(*args: str, check: bool = True, input: str | None = None) -> subprocess.CompletedProcess:
    """Run one command (`input`: its stdin); on failure raise TestbedError
    with the command and its stderr."""
    try:
        proc = subprocess.run(
            args, capture_output=True, text=True, timeout=COMMAND_TIMEOUT, check=False,
            input=input,
        )
    except subprocess.TimeoutExpired:
        raise TestbedError(f"`{' '.join(args)}` took more than {COMMAND_TIMEOUT:g} s") from None
    if check and proc.returncode != 0:
        detail = proc.stderr.strip() or proc.stdout.strip() or f"status {proc.returncode}"
        raise TestbedError(f"`{' '.join(args)}` failed: {detail}")
    return proc


def ip(netns: str | None, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    """`ip [-n NETNS] ARGS`."""
    return run("ip", *(("-n", netns) if netns else ()), *args, check=check)


def tc(netns: str | None, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    """`tc [-n NETNS] ARGS`."""
    return run("tc", *(("-n", netns) if netns else ()), *args, check=check)


def in_netns(netns: str, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    """Run a command inside a namespace: `ip netns exec NETNS ARGS`."""
    return run("ip", "netns", "exec", netns, *args, check=check)


def parse_json(proc: subprocess.CompletedProcess) -> list[dict]:
    """A `-j` command's output (empty: none)."""
    text = proc.stdout.strip()
    return json.loads(text) if text else []


def namespaces() -> set[str]:
    """Names of the named network namespaces (`ip netns list`)."""
    out = run("ip", "netns", "list").stdout
    return {line.split()[0] for line in out.splitlines() if line.strip()}


def links(netns: str | None, *args: str) -> list[dict]:
    """`ip -j link show ARGS` in a namespace, as dicts (empty if none match)."""
    proc = ip(netns, "-j", "link", "show", *args, check=False)
    return parse_json(proc) if proc.returncode == 0 else []


def link_stats(netns: str | None) -> list[dict]:
    """`ip -s -j link show` in a namespace: every link with its counters."""
    proc = ip(netns, "-s", "-j", "link", "show", check=False)
    return parse_json(proc) if proc.returncode == 0 else []


def link_exists(netns: str, ifname: str) -> bool:
    return bool(links(netns, "dev", ifname))


def root_qdisc(netns: str | None, ifname: str) -> dict | None:
    """The root qdisc of an interface (`tc -j qdisc show`), or None."""
    proc = tc(netns, "-j", "qdisc", "show", "dev", ifname, "root", check=False)
    if proc.returncode != 0:
        return None
    qdiscs = parse_json(proc)
    return qdiscs[0] if qdiscs else None


def netns_pids(netns: str) -> list[int]:
    """Processes running inside a namespace (`ip netns pids`)."""
    proc = run("ip", "netns", "pids", netns, check=False)
    return [int(p) for p in proc.stdout.split() if p.isdigit()]
