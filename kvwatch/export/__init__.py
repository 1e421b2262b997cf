"""Export: Prometheus exposition and human/JSON reports."""
