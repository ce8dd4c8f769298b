"""``python -m node`` runs the ``kith`` command."""

from node.cli.main import main

main()
