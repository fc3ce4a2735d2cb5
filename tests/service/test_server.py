"""service/server.py: what granian is told, and what the operator is told where granian cannot be told."""

from __future__ import annotations

from service.limits import Limits
from service.server import GRANIAN_WS_FRAME_BYTES, ws_frame_warning


def test_the_default_websocket_message_limit_is_granians_frame() -> None:
    # Every message granian carries in one frame reaches the guard, which answers a larger one (fragmented).
    assert Limits().max_ws_frame_bytes == GRANIAN_WS_FRAME_BYTES
    assert ws_frame_warning(Limits()) is None


def test_a_limit_over_granians_frame_is_warned_of() -> None:
    # granian has no setting for it: a bigger single frame closes the connection with no error event
    warning = ws_frame_warning(Limits(max_ws_frame_bytes=GRANIAN_WS_FRAME_BYTES + 1))
    assert warning is not None and "no error event" in warning
