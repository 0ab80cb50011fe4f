"""Shared by every test: cadence's built-in defaults, whatever tuning table
this machine's user may have written with `cadence tune` (the tests that
exercise tuning tables set CADENCE_TUNING_FILE themselves)."""

import os

os.environ.setdefault("CADENCE_TUNING_FILE", "none")
