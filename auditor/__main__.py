"""`python -m auditor` runs the CLI."""

from auditor.cli import main

main()
