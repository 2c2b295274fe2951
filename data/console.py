"""
console.py: progress lines of the data tools and the evaluator.

On a terminal a progress bar redraws in place with carriage returns; written to a file or a
pipe (a log), every update is a plain line of its own, so the log reads top to bottom.
"""

import sys

_bar_on_screen = False  # a bar drawn with \r and not yet ended with a newline


def progress_line(line, fraction, stream=None):
    """Shows `line` (e.g. "12/50 episodes, ETA 1m05s"), `fraction` done (0..1)."""
    global _bar_on_screen
    stream = stream or sys.stderr
    if stream.isatty():
        stream.write(f"\r[{'#' * int(30 * min(max(fraction, 0.0), 1.0)):<30}] {line} ")
        _bar_on_screen = True
    else:
        stream.write(line + "\n")
    stream.flush()


def end_progress(stream=None):
    """Ends a bar left on screen with a newline (nothing to do after plain lines)."""
    global _bar_on_screen
    stream = stream or sys.stderr
    if _bar_on_screen:
        stream.write("\n")
        stream.flush()
        _bar_on_screen = False
