"""The gateway's errors: each carries the HTTP status and the OpenAI error fields a client gets.

A client gets ``{"error": {"message", "type", "param", "code"}}`` (the shape the OpenAI SDK reads into its
``APIStatusError``), with ``param`` naming the request field at fault, and ``message`` naming the problem and
the fix.
"""

from __future__ import annotations

from typing import Any

from verl_ext.core.errors import VerlExtError


class GatewayError(VerlExtError, RuntimeError):
    """An error a gateway client sees: ``status`` is the HTTP status, the rest are OpenAI's error fields."""

    def __init__(
        self, status: int, message: str, *, type: str, param: str | None = None, code: str | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code

    def body(self) -> dict[str, Any]:
        """The OpenAI-style error body."""
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def bad_request(param: str | None, message: str, code: str = "invalid_value") -> GatewayError:
    """400: the request body is malformed or asks for something the gateway does not serve (``param`` names it)."""
    return GatewayError(400, message, type="invalid_request_error", param=param, code=code)


def unknown_session(session_id: str, ended_kept: int | None = None) -> GatewayError:
    """404: no session of this id is open, nor among the ended ones remembered. ``ended_kept``: how many ended ids
    the gateway remembers (said where the request was to end a session: it may have ended long before); None: a
    request to a gateway that opens sessions explicitly."""
    if ended_kept is None:
        why = "open it first (the gateway opens sessions explicitly here)"
    else:
        why = (
            "no session of this id was opened, or it ended before the last "
            f"{ended_kept:,} ended sessions the gateway remembers; nothing was ended (check the session id)"
        )
    return GatewayError(404, f"unknown session {session_id!r}: {why}", type="not_found_error", code="session_not_found")


def session_finished(session_id: str, why: str) -> GatewayError:
    """409: the session has ended; its tokens are checked and recorded, nothing more can be added."""
    return GatewayError(
        409,
        f"session {session_id!r} has ended ({why}); open a new session for a new rollout",
        type="invalid_request_error",
        code="session_finished",
    )
