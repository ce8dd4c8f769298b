"""Protocols shipped with Kith (package data; see protocols/*/README.md)."""
