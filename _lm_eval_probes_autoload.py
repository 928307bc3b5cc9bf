"""Registers ``hf-probes`` and ``hf-probes-diffusion`` with lm_eval 0.4.13 when lm_eval's registry is first imported.

Imported by ``lm_eval_probes.pth`` from site-packages at interpreter start (lm_eval 0.4.13 has no plugin
discovery). At start it only puts a finder first on ``sys.meta_path``: it imports nothing and costs microseconds, so a
Python start that never uses lm_eval pays nothing for the plugin. When a program first imports
``lm_eval.api.registry`` (the plain ``lm_eval --model hf-probes`` does, to resolve the model name), the finder lets
that module execute as usual and then calls
:func:`lm_eval_probes.harness.registry.register_model_placeholder` (lm_eval's built-in placeholders first, then
the plugin's lazy ones; no torch), and takes itself off ``sys.meta_path``.

An lm_eval that discovers the ``lm_eval.models`` entry points itself (its registry has ``load_plugins``: the
plugin-discovery pull request after 0.4.13) finds the models through ``setup.cfg``'s entry points; the finder then
stands aside and registers nothing. Any failure is swallowed so that a broken environment never breaks an
unrelated import.
"""

import sys

TARGET = "lm_eval.api.registry"


def _register(registry) -> None:
    if hasattr(registry, "load_plugins"):  # lm_eval discovers the entry points itself
        return
    from lm_eval_probes.harness.registry import register_model_placeholder

    register_model_placeholder()


class _RegisteringLoader:
    """The registry's own loader; after the module has executed, the plugin's placeholders are registered."""

    def __init__(self, loader) -> None:
        self._loader = loader

    def __getattr__(self, name):  # get_source, get_code, is_package, …: the wrapped loader's
        return getattr(self._loader, name)

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module) -> None:
        self._loader.exec_module(module)
        try:
            _register(module)
        except Exception:  # pragma: no cover - never break the importing program
            pass


class RegisterOnRegistryImport:
    """A ``sys.meta_path`` finder that answers only for :data:`TARGET`, with the spec the other finders give,
    its loader wrapped by :class:`_RegisteringLoader`; it removes itself once it has answered."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname != TARGET:
            return None
        self.uninstall()
        for finder in sys.meta_path:
            find_spec = getattr(finder, "find_spec", None)
            spec = find_spec(fullname, path, target) if find_spec is not None else None
            if spec is not None:
                break
        else:
            return None
        if spec.loader is not None and hasattr(spec.loader, "exec_module"):
            spec.loader = _RegisteringLoader(spec.loader)
        return spec

    def uninstall(self) -> None:
        # a new list: the import system goes on iterating the one it holds
        sys.meta_path = [finder for finder in sys.meta_path if finder is not self]

    @classmethod
    def install(cls) -> None:
        """Put one finder first on ``sys.meta_path`` (none when one is there already; when the registry is imported
        already, register now)."""
        if TARGET in sys.modules:
            _register(sys.modules[TARGET])
            return
        if not any(isinstance(finder, cls) for finder in sys.meta_path):
            sys.meta_path.insert(0, cls())


try:
    RegisterOnRegistryImport.install()
except Exception:  # pragma: no cover - never break interpreter start-up
    pass
