"""Placeholder, filled in below."""
