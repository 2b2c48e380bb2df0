"""Never imported: the name under which the runtime's bytecode bundle is cached.

The bundle (see ``__init__``) is written where this module's cached bytecode would go
(``importlib.util.cache_from_source``: ``__pycache__/_bundle.<cache tag>[.opt-N].pyc``), so it follows the
optimisation level and ``PYTHONPYCACHEPREFIX`` as every ``.pyc`` does, and ``pip uninstall`` removes it with the
package's other cached bytecode.
"""
