"""`python -m tracelens` runs the CLI."""

from tracelens.cli import main

main()
