"""Shared pytest set-up: hypothesis profiles.

``dev`` (default) keeps the local loop quick; ``ci`` searches harder, never
fails on a slow example and prints the blob needed to reproduce a failure.
Pick one with ``HYPOTHESIS_PROFILE`` (the Makefile sets ``ci`` when ``CI`` is set).
"""

from __future__ import annotations

import os

from hypothesis import settings

settings.register_profile("dev", max_examples=100)
settings.register_profile("ci", max_examples=500, deadline=None, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "dev"))
