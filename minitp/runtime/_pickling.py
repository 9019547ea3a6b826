"""How a function travels to the ranks, and a result back: cloudpickle, keeping file names.

cloudpickle sends a function defined in a notebook cell (or any function it pickles
by value) with its code object. From cloudpickle 3.1 on, its code reducer replaces
the code's ``co_filename`` with ``"<dynamic-code>"`` to make payloads deterministic,
so a rank's traceback through that function reads ``File "<dynamic-code>", line 4``
with no source line. Here a code object travels as `marshal` bytes instead, which
keep every field, the file name included; the launcher and the ranks are the same
interpreter (the forkserver is forked from it), so marshal's format always matches.
With the file name kept, the cell's lines that the launcher copies into each rank's
linecache show in the traceback, as they would locally.
"""

from __future__ import annotations

import io
import marshal
import pickle
import types

import cloudpickle


class CodeKeepingPickler(cloudpickle.Pickler):
    """cloudpickle, except that code objects keep their file name (see the module)."""

    def reducer_override(self, obj):
        if isinstance(obj, types.CodeType):
            return marshal.loads, (marshal.dumps(obj),)
        return super().reducer_override(obj)


def dumps(obj, pickler: type[CodeKeepingPickler] = CodeKeepingPickler) -> bytes:
    buffer = io.BytesIO()
    pickler(buffer, protocol=pickle.HIGHEST_PROTOCOL).dump(obj)
    return buffer.getvalue()
