"""openapi/openapi.json: generated from the app's routes and schemas (`tandem openapi`), checked in CI.

The document is built from an app with no engine, so it never depends on a model being present.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

__all__ = ["SPEC_PATH", "openapi_document", "render_openapi", "write_openapi", "openapi_drift"]

SPEC_PATH = Path(__file__).resolve().parent.parent / "openapi" / "openapi.json"


def openapi_document() -> dict[str, Any]:
    """The OpenAPI document the app serves at /docs/openapi.json. Raises nothing for a valid app."""
    from service.app import create_app
    from service.state import AppState

    app = create_app(AppState())
    return app.openapi_schema.to_schema()


def render_openapi() -> str:
    """The document as stable, diffable text (sorted keys, two-space indent, trailing newline). Raises nothing."""
    return json.dumps(openapi_document(), indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def write_openapi(path: Path = SPEC_PATH) -> Path:
    """Write the document to `path`. Raises OSError when it cannot be written."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render_openapi(), encoding="utf-8")
    return path


def openapi_drift(path: Path = SPEC_PATH) -> str | None:
    """None when `path` matches what the app serves, else a short description of the difference.

    Raises nothing (a missing file is reported as drift)."""
    expected = render_openapi()
    try:
        current = path.read_text(encoding="utf-8")
    except OSError:
        return f"{path} is missing; run `tandem openapi`"
    if current == expected:
        return None
    import difflib

    diff = list(difflib.unified_diff(current.splitlines(), expected.splitlines(), "committed", "app", lineterm="", n=1))
    shown = "\n".join(diff[:40])
    return f"{path} differs from the app's schema; run `tandem openapi`.\n{shown}"
