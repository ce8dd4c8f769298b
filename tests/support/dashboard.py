"""The local dashboard as a logged-in browser would use it."""

from __future__ import annotations

import httpx


def logged_in(base: str, login: str) -> httpx.Client:
    """An httpx client at ``base`` holding the session cookie the one-time ``login`` URL
    sets (checked HttpOnly and SameSite=Strict)."""
    client = httpx.Client(base_url=base, timeout=30, follow_redirects=False)
    r = client.get(login)
    assert r.status_code == 303 and r.headers["location"] == "/"
    cookie = r.headers["set-cookie"]
    assert "httponly" in cookie.lower() and "samesite=strict" in cookie.lower()
    return client
