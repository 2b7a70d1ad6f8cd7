"""tiermem memory package."""
