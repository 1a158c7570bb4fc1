"""Configuration: the schema (`schema.py`) and its loading/validation (`load.py`)."""

from .load import load_config, to_tree
from .schema import Config

__all__ = ["Config", "load_config", "to_tree"]
