"""Test-wide settings: optional analyzers raise instead of turning failures into warnings; hypothesis runs
derandomized in CI (the same cases every run: a failure reproduces) and explores new cases locally.

Profiles: `ci` (derandomize=True), chosen when the CI environment variable is set; `explore` (random, the
default elsewhere); HYPOTHESIS_PROFILE=ci|explore picks one explicitly.
"""

import os

from hypothesis import settings

os.environ["TRACELENS_STRICT"] = "1"

settings.register_profile("ci", derandomize=True, print_blob=True)
settings.register_profile("explore", derandomize=False)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE") or ("ci" if os.environ.get("CI") else "explore"))
