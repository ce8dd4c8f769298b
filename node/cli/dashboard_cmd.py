"""``kith dashboard``: the owner's loopback dashboard in the browser (issue 12; specs/dashboard.md)."""

from __future__ import annotations

import typer

from node.cli.common import console, emit_json, err_console, host_option, identity_home_of, port_option


def dashboard_cmd(
    ctx: typer.Context,
    host: str = host_option(),
    port: int = port_option(8766),
    open_browser: bool = typer.Option(False, "--open", help="Open the login URL in the default browser."),
    json_out: bool = typer.Option(False, "--json", help='Print {"url", "login"} on stdout once listening.'),
    login_link: bool = typer.Option(False, "--login-link", help="Print a new one-time login URL for the dashboard already running on this home (the old one stops working) and exit."),
) -> None:
    """Serve the owner's dashboard on loopback until Ctrl-C: overview, roots, policy, peers,
    live sessions, approvals and a search "as a peer sees it". Prints a login URL that
    works once (it sets a session cookie); every form carries a CSRF token; a foreign
    Host or Origin is refused."""
    from node.local.dashboard.app import check_host, keeps_login_file, serve

    check_host(host)
    # a typo in --home must not serve (and create) an empty node (issue 12, item 7)
    home = identity_home_of(ctx)
    if login_link:
        from node.local.dashboard.app import new_login_link

        link = new_login_link(home)
        if json_out:
            emit_json({"login": link})
        else:
            err_console.print("a new one-time login URL (the earlier one no longer works):",
                              highlight=False, markup=False)
            console.print(link, highlight=False, markup=False, soft_wrap=True)
        return

    def listening(base: str, login: str) -> None:
        err_console.print(f"kith dashboard on {base} (Ctrl-C to stop); open once to log in:",
                          highlight=False, markup=False)
        # the URL alone on its own line, never wrapped, so it can be copied off a terminal
        err_console.print(login, highlight=False, markup=False, soft_wrap=True)
        if not keeps_login_file(home):
            err_console.print("note: this home is read-only for you: the login URL is kept in memory only (no "
                              "dashboard.login), so `kith dashboard --login-link` cannot make a new one — restart "
                              "the dashboard for a new one; changes made on its pages are refused",
                              highlight=False, markup=False, soft_wrap=True)
        if json_out:
            emit_json({"url": base, "login": login})
        if open_browser:
            import webbrowser

            webbrowser.open(login)

    serve(home, host, port, on_listening=listening)
    err_console.print("kith dashboard stopped", highlight=False)
