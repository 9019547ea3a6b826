"""python -m minitp.course.grade exNN [--solutions] [--path FILE]: grade an exercise.

The grader itself is `minitp.course.grading` (``mt.grade`` in a notebook); this module
is only its command line, kept apart so that ``python -m`` runs it fresh.
"""

import sys

from .grading import main

if __name__ == "__main__":
    sys.exit(main())
