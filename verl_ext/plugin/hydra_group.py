"""Put verl_ext's Hydra config group (``+verl_ext=warn|strict|audit``) on Hydra's search path.

An installed wheel ships ``hydra_plugins/verl_ext_searchpath``, which Hydra finds by scanning the
``hydra_plugins`` namespace package. An editable install (``pip install -e``) maps that package through an import
hook that Hydra's scan cannot list, so the plugin also registers the class through Hydra's public
``Plugins.instance().register``, once ``hydra`` is imported (registering twice is a no-op).
"""

from __future__ import annotations

import logging
from types import ModuleType

log = logging.getLogger("verl_ext.plugin")


def register_searchpath_plugin(_hydra: ModuleType | None = None) -> None:
    """Runs inside ``import hydra`` (post-import hook): a failure is logged with the fix, never breaks the import."""
    try:
        from hydra.core.plugins import Plugins

        from hydra_plugins.verl_ext_searchpath import VerlExtSearchPathPlugin

        Plugins.instance().register(VerlExtSearchPathPlugin)
    except Exception:
        log.exception(
            "verl_ext: could not put its config group on Hydra's search path; `+verl_ext=<preset>` needs "
            "`hydra.searchpath=[pkg://verl_ext.configs]` on the command line"
        )
