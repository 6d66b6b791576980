"""Reports from audit results: summaries, offenders and advice, renderers. No database access."""
