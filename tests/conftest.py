"""Shared by every test: cadence's built-in defaults, whatever tuning table
this machine's user may have written with `cadence tune` (the tests that
exercise tuning tables set CADENCE_TUNING_FILE themselves), no start-up
calibration (on by default for users), so that `auto` chooses by the size
table and every run of a test exercises the same algorithms (the calibration
tests turn it on), and no start-up topology profile (on by default for jobs
across three hosts or more; tests/test_topo.py turns it on), so that rings
run in rank order and set-up costs no profile."""

import os

os.environ.setdefault("CADENCE_TUNING_FILE", "none")
os.environ.setdefault("CADENCE_CALIBRATE", "0")
os.environ.setdefault("CADENCE_TOPO_FILE", "none")
