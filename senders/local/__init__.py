"""The local file sender, and reading its files back (replay)."""
