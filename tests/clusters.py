"""Whether the emulated cluster (network namespaces) can be made here, for
the tests that need one."""

from __future__ import annotations

import os
import shutil
import subprocess

from cadence import testbed

#: The tools the emulated cluster runs, missing here.
TOOLS = [t for t in ("ip", "tc", "unshare", "hostname") if shutil.which(t) is None]


def why_no_clusters() -> str | None:
    """Why real clusters cannot be made here (then those tests skip; under
    CI a skip fails), or None."""
    if os.geteuid() != 0:
        return testbed.ROOT_MESSAGE
    if TOOLS:
        return f"{', '.join(TOOLS)} not installed (apt-get install iproute2 util-linux)"
    # Root in a container without CAP_SYS_ADMIN still may not make namespaces.
    # Only that refusal skips; any other failure is the tests' to report.
    probe = f"cad-probe{os.getpid()}"
    p = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True, timeout=30)
    if p.returncode == 0:
        subprocess.run(["ip", "netns", "delete", probe], capture_output=True, timeout=30)
        return None
    if "not permitted" in p.stderr or "Permission denied" in p.stderr:
        return f"network namespaces are not permitted here: {p.stderr.strip()}"
    return None
