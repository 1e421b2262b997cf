"""Sources: bytes in (log tail, /metrics scrape, child process). No parsing here."""
