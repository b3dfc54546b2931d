from shipyard.tasks import *  # noqa: F401,F403 - invoke's tasks in the checkout; shipyard/tasks.py holds them
