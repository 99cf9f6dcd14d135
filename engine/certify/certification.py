"""Transitional alias: bench/harness.py (being rewritten elsewhere) still imports
certify_from_counts from here. CERTIFY and PREDICT live in diffsmooth.engine.certify.core."""

from diffsmooth.engine.certify.core import certify_from_counts  # noqa: F401
