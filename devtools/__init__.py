"""Tools for developing and trying the capturer: the demo, private MariaDB/PostgreSQL servers,
the BaikalDB test double and the workloads the demo and the tests drive. Not part of the pipeline:
nothing under capturer/ or senders/ imports it (only the command line, for --demo).
"""
