"""Kith: a peer-to-peer knowledge-sharing node (see README.md and specs/)."""

__version__ = "0.1.0"
