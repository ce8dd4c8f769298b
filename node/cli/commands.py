"""Core commands: init, host, join, protocol (registered on import)."""
