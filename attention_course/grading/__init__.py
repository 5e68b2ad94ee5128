"""The grading side of the course, for instructors and course authors (the ``grader`` extra).

Students need none of this: the package's references and checkers, and the check cells of
the exercise notebooks, are the student's side. Here:

* :mod:`.grade`: ``attention-course grade``, one submission or a class;
* :mod:`.isolation`: each submission's kernel in its own operating-system sandbox;
* :mod:`.absent`: the package as the sandbox sees it, with the references the exercise
  does not hand out left out (stubs);
* :mod:`.sandbox`: the checkers run in the grader, on proxies of the kernel's objects;
* :mod:`.cheats`: the static scan of a submission's code;
* :mod:`.gradebook`: results written as each submission is graded, and merged;
* :mod:`.release`: ``attention-course release``, which makes a student copy from a solved
  twin (for course authors);
* :mod:`.notebooks`, :mod:`._kernel`: running notebooks and kernels.

Install with ``pip install "attention-course[grader]"`` (nbclient, nbformat, ipykernel) and
the Debian/Ubuntu package ``bubblewrap``.
"""
