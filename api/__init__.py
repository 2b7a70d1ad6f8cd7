"""tiermem's HTTP service: a FastAPI app over :class:`memory.Memory`.

::

    from api import create_app

    app = create_app()          # settings from TIERMEM_* environment variables

or from the shell: ``tiermem serve``.
"""

from api.app import create_app

__all__ = ["create_app"]
