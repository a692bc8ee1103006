"""MySQL/MariaDB regions: binlog reading, row decoding, snapshots."""

from capturer.regions.kind import RegionKind

KIND = RegionKind("mysql", "capturer.regions.mysql.region:MySQLRegion", check="capturer.regions.mysql.check",
                  verify="capturer.regions.mysql.verify:source")
