"""JSON read strictly: a key given twice or nesting past any sane depth is an error, never "last wins"."""

from __future__ import annotations

import json
from typing import Any

from ..errors import ProfileError


def _refuse_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    seen: dict[str, Any] = {}
    for key, value in pairs:
        if key in seen:
            raise ProfileError(f"the key {key!r} appears twice in one object (which one is meant?)")
        seen[key] = value
    return seen


def loads_strict(text: str | bytes, what: str) -> Any:
    """The JSON document `text`; a ProfileError naming `what` if it is invalid, nests too deeply or
    repeats a key within one object."""
    try:
        return json.loads(text, object_pairs_hook=_refuse_duplicates)
    except json.JSONDecodeError as err:
        raise ProfileError(f"{what} is not valid JSON ({err}); the file is corrupt or truncated") from None
    except UnicodeDecodeError:
        raise ProfileError(f"{what} is not a text JSON file (corrupt or binary)") from None
    except RecursionError:
        raise ProfileError(f"{what} nests JSON too deeply") from None
    except ProfileError as err:
        raise ProfileError(f"{what}: {err}") from None
