"""Exit codes shared by the commands and the SLURM job script that reads them."""

OK = 0
#: the command ran, but part of its work failed (a trial, a case)
FAILED = 1
#: bad input or options: one ``distmis: error:`` line, nothing written
USAGE = 2
#: stopped on request (the wall-time warning) after checkpointing; ``--resume`` continues it.
#: EX_TEMPFAIL from sysexits.h: "try again later", which is what the job script does (requeue)
INTERRUPTED = 75
#: stopped by Ctrl-C: 128 + SIGINT, as a shell reports a process its interrupt key ended
KEYBOARD_INTERRUPT = 130

__all__ = ["FAILED", "INTERRUPTED", "KEYBOARD_INTERRUPT", "OK", "USAGE"]
