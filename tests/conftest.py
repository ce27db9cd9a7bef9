"""Test-wide settings: optional analyzers raise instead of turning failures into warnings."""

import os

os.environ["TRACELENS_STRICT"] = "1"
