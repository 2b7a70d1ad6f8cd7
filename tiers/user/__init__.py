"""The user tier: long-lived facts and preferences with provenance and history.

The public face of the package; ``_tier.py`` holds :class:`UserTier`.
"""

from tiers.user._tier import (
    DecodedFacts,
    UserTier,
)

__all__ = [
    "DecodedFacts",
    "UserTier",
]
