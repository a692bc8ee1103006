"""Regions served by region agents (type=remote) and by worker processes (process=true)."""
