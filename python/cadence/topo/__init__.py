"""Topology: measure the network between a job's hosts (`profile`), infer
the groups that share a bottleneck (`infer`), draw it (`draw`). The path
finder that turns a topology file into ring orders is the core's
(`cadence._core.topo_ring`, crates/cadence-core/src/fabric); the file
format is in docs/topology.md."""
