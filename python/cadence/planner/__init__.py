"""`cadence planner`: C4P's path planner for jobs sharing a leaf–spine
fabric (docs/traffic.md). `assign` decides which spine each stream between
racks takes."""
