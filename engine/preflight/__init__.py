"""`diffsmooth preflight`: on a small sample of the selected images, does the set-up behave as the table needs,
before any GPU hour is spent (docs/cli.md#preflight)."""
