"""Commands: the edge where the stages are wired together for each CLI command."""
