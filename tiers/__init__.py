"""tiermem tiers package."""
