"""Parse: pure functions from text to records. No files, network or clock."""
