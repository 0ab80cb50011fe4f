"""An emulated multi-host cluster on one machine, from Linux network namespaces.

    from cadence import testbed
    cluster = testbed.build("tb", hosts=4, nics=1, rate="1gbit")
    testbed.up(cluster)                               # idempotent
    testbed.set_link(cluster, host=2, nic=0, rate="200mbit")
    testbed.set_link(cluster, host=2, nic=0, up=False)   # cut it
    racked = testbed.build("tr", hosts=4, nics=1, rate="1gbit", racks=2,
                           uplink_rate="250mbit", placement="interleaved")
    result = testbed.jobs.run(cluster, 2, ["python", "train.py"], timeout=600)
    testbed.down("tb")

`cluster` describes the model (hosts, rails, links); `jobs` starts ranks on it
as torchrun would, and Open MPI jobs through mpirun; `rates` spells link rates.
Everything needs root; without it calls raise TestbedError with that reason.
"""

from cadence.testbed import fabric, jobs
from cadence.testbed.cluster import (
    Cluster,
    Host,
    LinkState,
    Nic,
    Uplink,
    UplinkState,
    build,
    down,
    link_states,
    load,
    names,
    require,
    set_link,
    set_uplink,
    up,
    uplink_states,
)
from cadence.testbed.iproute import ROOT_MESSAGE, TestbedError, check_root

__all__ = [
    "Cluster", "Host", "LinkState", "Nic", "ROOT_MESSAGE", "TestbedError", "Uplink",
    "UplinkState", "build", "check_root", "down", "fabric", "jobs", "link_states", "load", "names",
    "require", "set_link", "set_uplink", "up", "uplink_states",
]  # fmt: skip
