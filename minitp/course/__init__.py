"""The course around the library: what teaches, grades and draws, never what trains.

* `grading` (``mt.grade``) and `grade` (``python -m minitp.course.grade exNN``): the
  exercise grader, running the learner's code on real processes; `graders/`, one
  module per exercise, says what must hold.
* `make_exercises`: the learner's files in exercises/, generated from solutions/.
* `labs/`: the lessons' experiments (``mt.labs``), each one measured run set beside its model.
* `viz/`: the pictures (``mt.viz``), which read traces and never run a model.
* `doctor`: ``python -m minitp.course.doctor``, what an instructor runs on the node before class.
* `paths`: where exercises/, solutions/ and notebooks/ are.
* `estimate`: how long each lesson takes (a model from its words, code, exercise and
  questions), and the core paths lesson 00 gives.

Nothing in the library imports this package: ``import minitp`` and every launched
rank load none of it (the facade imports it on first use).
"""
