"""Configuration and the backend registry (floor 1, beside the oracle).

- :mod:`~kvref.config.settings`: settings from argument, environment, file or default (CONF-9xx);
- :mod:`~kvref.config.registry`: backends by name, through the ``kvref.backends`` entry points.
"""

from kvref.config.settings import OPTIONS, Option, Settings, load_settings

__all__ = ["OPTIONS", "Option", "Settings", "load_settings"]
