"""The `shipyard` command and `python -m shipyard TASK`: shipyard's tasks (shipyard/tasks.py) from any folder."""

from shipyard import collector


def run() -> None:
    """The program's entry: the collector is held while the tasks and the command's modules load
    (shipyard.collector), then the tasks run."""
    collector.hold()
    from shipyard.tasks import main  # lazy: imported after the hold, so its start is not walked by the collector

    main()


if __name__ == "__main__":
    run()
