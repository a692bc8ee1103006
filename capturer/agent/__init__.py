"""Region agents: run regions next to their sources and serve them to capturers over gRPC."""
