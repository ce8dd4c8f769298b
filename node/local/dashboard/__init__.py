"""``kith dashboard``: the owner's loopback dashboard (issue 12; specs/dashboard.md)."""

from node.local.dashboard.app import (DEFAULT_PORT, check_host, create_app, run_dashboard_in_thread,
                                      serve)

__all__ = ["DEFAULT_PORT", "check_host", "create_app", "run_dashboard_in_thread", "serve"]
