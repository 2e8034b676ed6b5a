"""One JSON object from a line or a small file, or None: the guard every reader of the tool's own
JSON records (the trainer's log lines, steps/<attempt>.jsonl, the run directory's records) puts in
front of json.loads, so a torn, foreign or hostile line is skipped, never raised.

Standard library only: the watchdog and the straggler check import it on the batch host.
"""

from __future__ import annotations

import json
from typing import Any, Optional


def json_object(text: Optional[str]) -> Optional[dict[str, Any]]:
    """text (surrounding white space ignored) parsed as JSON when it is one object; None otherwise
    (None, empty, not starting with "{", invalid JSON, or another JSON type)."""
    if text is None:
        return None
    text = text.strip()
    if not text.startswith("{"):
        return None
    try:
        doc = json.loads(text)
    except ValueError:  # json.JSONDecodeError, and UnicodeDecodeError for bytes
        return None
    return doc if isinstance(doc, dict) else None
