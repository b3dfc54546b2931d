"""`python -m shipyard TASK`: the same as the `shipyard` command (shipyard/tasks.py)."""

from shipyard.tasks import main

main()
