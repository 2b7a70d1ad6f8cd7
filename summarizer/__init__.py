"""tiermem summarizer package."""
