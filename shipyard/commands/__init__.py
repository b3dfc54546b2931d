"""The use cases: one module per group of tasks, between ``tasks.py`` (flags) and the stage packages (work).

Why a layer of its own: every task used to load the registry, resolve names, run the checks, print and choose an exit
code inside the stage that does the work, each in its own way (one ``invoke launch`` resolved the environment four
times). Here a command does exactly that, once, through a :class:`~shipyard.commands.context.Context`: load the
registry, resolve the :class:`~shipyard.registry.model.Environment` and :class:`~shipyard.registry.model.Cluster`
objects, run the check gate (:mod:`shipyard.commands.gate`), hand the objects to the stages, print, and return an exit
code. The stages below take objects and return values; none of them loads the registry, prints a table of problems
or imports this package (``tests/test_architecture.py`` enforces it).
"""
