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


# --- under CI a skip is a failure -----------------------------------------
# Tests skip, with the reason, where a component is missing (root, Open MPI,
# Chromium, iproute2, the built extension) so that a developer's partial machine
# still runs the rest. CI's machine has or installs every one of them, so there
# a skip means a lost install step: it fails, naming the reason. A skip for
# hardware CI does not have (a GPU) is marked `hardware_skip` and stays a skip.

import pytest  # noqa: E402

UNDER_CI = os.environ.get("CI") == "true"


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "hardware_skip: the test may skip under CI (it needs hardware CI does not have)")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if not (UNDER_CI and report.skipped) or hasattr(report, "wasxfail"):
        return
    if item.get_closest_marker("hardware_skip") is not None:
        return
    reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
    report.outcome = "failed"
    report.longrepr = (f"skipped under CI=true: {reason}\n"
                       "CI must have every component this test needs (make build installs them); "
                       "a skip here means an install step was lost")
