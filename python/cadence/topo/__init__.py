"""Topology: measure the network between a job's hosts (`profile`) and draw
it (`draw`). The profiler, the inference of groups that share a bottleneck,
and the path finder that turns a topology file into ring orders are the
core's (crates/cadence-core/src/comm/profile.rs and src/fabric); the file
format is in docs/topology.md."""
