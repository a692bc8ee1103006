"""PostgreSQL regions: logical decoding with the built-in pgoutput plugin."""
