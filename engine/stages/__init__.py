"""Backends share one contract (see base.py); the pipeline never asks which one it holds."""
