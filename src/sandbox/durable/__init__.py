"""Sessions that outlive their client: refs, detach, resume, takeover, the ref file.

`refs` (`SessionRef`, `ProcessRef`), `lease` (one owner across clients), `ref_file`
(the crash file), `resume` (`resume_session`), `ops` (what the base session's
`ref()`/`detach()`/close do with them), `state` (per-session bookkeeping).
See docs/durable-sessions.md.
"""

from .ref_file import read_ref_file
from .refs import ProcessNotReattached, ProcessRef, SessionRef
from .resume import resume_session

__all__ = ["ProcessNotReattached", "ProcessRef", "SessionRef", "read_ref_file", "resume_session"]
