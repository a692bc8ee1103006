"""MySQL/MariaDB regions: binlog reading, row decoding, snapshots."""
