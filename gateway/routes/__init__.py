"""The routes that belong to no API surface: health, metrics, models."""
