"""Operator-facing parts: the HTTP status server and page, and the command-line operator commands."""
