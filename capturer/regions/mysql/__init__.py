"""MySQL/MariaDB regions: binlog reading, row decoding, snapshots."""

from capturer.regions.kind import RegionKind

KIND = RegionKind("mysql", "capturer.regions.mysql.region:MySQLRegion", check="capturer.regions.mysql.check",
                  keys="capturer.regions.mysql.keys:KEYS", parse="capturer.regions.mysql.keys:parse",
                  claim="capturer.regions.mysql.keys:claim",
                  verify="capturer.regions.mysql.verify:source")
