"""The `cadence` command line (see cadence.cli.main)."""
