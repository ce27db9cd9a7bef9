"""CLI sub-commands, one module each; registered in tracelens/cli.py."""
