"""PostgreSQL regions: logical decoding with the built-in pgoutput plugin."""

from capturer.regions.kind import RegionKind

KIND = RegionKind("postgresql", "capturer.regions.postgresql.region:PostgresRegion",
                  keys="capturer.regions.postgresql.keys:KEYS", parse="capturer.regions.postgresql.keys:parse",
                  claim="capturer.regions.postgresql.keys:claim",
                  check="capturer.regions.postgresql.check",
                  verify="capturer.regions.postgresql.verify:source",
                  extra="postgresql", journal=True)
