"""DiLoCo across trainer sites: not built yet."""
