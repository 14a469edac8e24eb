"""The command line's commands, by subject; ``cli.py`` is the entry point that assembles them
(with the set-up commands: doctor, build, workloads, datagen).

A package of its own because the commands have no home among the library's packages: each is a
thin call into them (options parsed, one library call, a print), and nothing below imports a
command (tests/test_layering.py).
"""
