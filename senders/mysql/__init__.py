"""The MySQL sender and its row-conflict detection."""
