"""The embedded demo: shipped models and data, the demo run, and how the demo models were trained."""
