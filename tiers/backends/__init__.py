"""tiermem tiers/backends package."""
