"""Certification: counter-based noise, Monte Carlo vote counting, and CERTIFY/PREDICT (core.py)."""
