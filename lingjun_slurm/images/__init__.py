"""Container-image helpers (image references, registries, enroot images)."""
