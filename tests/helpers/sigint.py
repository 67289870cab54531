"""``with_sigint(argv)``: a Python child's argv that a Ctrl-C reaches whatever this test
process's own state of SIGINT. An ignored or blocked SIGINT is inherited across exec,
and in a full CI run some earlier test left it so in the pytest process: the Ctrl-C
tests passed alone and timed out there, twice (not found which test, yet)."""

import sys

_RESET = (
    "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); "
    "signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGINT]); "
    "os.execv(sys.executable, [sys.executable, *sys.argv[1:]])"
)


def with_sigint(argv: list[str]) -> list[str]:
    """``argv`` (``sys.executable`` first), run with SIGINT's default action."""
    assert argv[0] == sys.executable, argv
    return [sys.executable, "-c", _RESET, *argv[1:]]
