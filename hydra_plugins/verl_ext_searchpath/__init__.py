"""Hydra discovers this plugin in the ``hydra_plugins`` namespace package: it puts verl_ext's config group on the
search path of every Hydra app (verl's ``main_ppo`` among them), so ``+verl_ext=strict`` selects a preset."""

from hydra.core.config_search_path import ConfigSearchPath
from hydra.plugins.search_path_plugin import SearchPathPlugin


class VerlExtSearchPathPlugin(SearchPathPlugin):
    def manipulate_search_path(self, search_path: ConfigSearchPath) -> None:
        # appended: the app's own configs and its hydra.searchpath keep precedence; verl_ext only adds a group
        search_path.append(provider="verl_ext", path="pkg://verl_ext.configs")
