"""ex14: the learner's functions called in this process, and their answers read —
a failed call or an answer in the wrong form is a `_Failed`, whose text the check shows."""

from __future__ import annotations


class _Failed(Exception):
    """The learner's function failed or answered in the wrong form: the check's text."""

    def __init__(self, detail: str, hint: str):
        super().__init__(detail)
        self.detail, self.hint = detail, hint


def _call(function, *args):
    try:
        return function(*args)
    except NotImplementedError as exc:
        raise _Failed(f"{function.__name__} is not written yet", str(exc)) from None
    except Exception as exc:  # noqa: BLE001 - the learner's bug, reported politely
        raise _Failed(f"{function.__name__}{args[1:] if len(args) > 1 else ''}: raised "
                      f"{type(exc).__name__}: {exc}", "run it by hand on the same arguments"
                      ) from None


def _items(answer, what: str) -> set:
    """{(file, tensor, element)} of a {file: {tensor: runs}} answer."""
    form = "return {file: {tensor: [(start, stop), ...]}}"
    if not isinstance(answer, dict):
        raise _Failed(f"{what} returned {type(answer).__name__}, not a dict", form)
    out = set()
    for f, tensors in answer.items():
        if not isinstance(tensors, dict):
            raise _Failed(f"{what}: {f!r} maps to {type(tensors).__name__}, not a dict", form)
        for tensor, spans in tensors.items():
            for span in spans:
                start, stop = span
                out.update((f, tensor, i) for i in range(int(start), int(stop)))
    return out


def _counted(answer, what: str) -> dict:
    """{(file, tensor, element): how many times it is named} of an answer."""
    counts = {}
    for f, tensors in answer.items():
        for tensor, spans in tensors.items():
            for start, stop in spans:
                for i in range(int(start), int(stop)):
                    counts[f, tensor, i] = counts.get((f, tensor, i), 0) + 1
    return counts
