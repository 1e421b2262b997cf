"""``python -m kvwatch``."""

from kvwatch.cli import main

main()
