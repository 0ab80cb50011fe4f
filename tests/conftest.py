"""Shared by every test: cadence's built-in defaults, whatever tuning table
this machine's user may have written with `cadence tune` (the tests that
exercise tuning tables set CADENCE_TUNING_FILE themselves), and no start-up
calibration (on by default for users), so that `auto` chooses by the size
table and every run of a test exercises the same algorithms (the calibration
tests turn it on)."""

import os

os.environ.setdefault("CADENCE_TUNING_FILE", "none")
os.environ.setdefault("CADENCE_CALIBRATE", "0")
