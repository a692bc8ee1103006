"""Regions served by region agents (type=remote) and by worker processes (process=true)."""

from capturer.regions.kind import RegionKind

KIND = RegionKind("remote", "capturer.regions.remote.region:RemoteRegion", check="capturer.regions.remote.check",
                  keys="capturer.regions.remote.keys:KEYS", parse="capturer.regions.remote.keys:parse",
                  claim="capturer.regions.remote.keys:claim", agent=True,
                  no_verify="its source is reached through an agent")
