"""The ``meshfeed`` command: ``main`` parses flags and calls one function per subcommand.

``demo`` and ``bench`` live here, beside the command that runs them: they are programs
built on meshfeed's public API, not part of it.
"""

from meshfeed._cli.main import main as main

__all__ = ["main"]
