"""The verbs of one training step, each making one frozen record (records.py)."""
