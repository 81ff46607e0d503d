"""The profile format's version numbers, written and read (no torch here: `duocal profile --help` says them)."""

VERSION = 3  # written: deploy sizes per policy ("sizes": {policy: {field: tokens}})
# read too: 1 (flat deploy sizes shared between policies), 2 (1 + "measurements"; see profile/measurements.py)
READABLE_VERSIONS = (1, 2, VERSION)
