"""tiermem api package."""
