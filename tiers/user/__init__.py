"""The user tier: long-lived facts and preferences with provenance and history.

The public face of the package; ``_tier.py`` holds :class:`UserTier`,
``_decoded.py`` the cache of decoded facts it reads through.
"""

from tiers.user._decoded import DecodedFacts
from tiers.user._tier import UserTier

__all__ = [
    "DecodedFacts",
    "UserTier",
]
