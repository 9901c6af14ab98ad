"""The one thing pyproject.toml cannot say: install the startup hook
(runtime/capture/cute-aot-startup.pth) at the top of site-packages, where site runs it in every
Python process, from a wheel and from an editable install alike (runtime/capture/activation.py:
it does nothing unless a CUTE_AOT_* variable asks)."""

from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.command.editable_wheel import editable_wheel

STARTUP = Path("runtime") / "capture" / "cute-aot-startup.pth"


class BuildPyWithStartupHook(build_py):
    def run(self):
        super().run()
        self.copy_file(str(STARTUP), str(Path(self.build_lib) / STARTUP.name), preserve_mode=0)

    def get_outputs(self, include_bytecode=True):
        return [*super().get_outputs(include_bytecode), str(Path(self.build_lib) / STARTUP.name)]


class EditableWheelWithStartupHook(editable_wheel):
    """An editable wheel holds only setuptools' own finder: add the startup hook beside it."""

    def _select_strategy(self, name, tag, build_lib):
        return _AlsoStartupHook(super()._select_strategy(name, tag, build_lib))


class _AlsoStartupHook:
    def __init__(self, strategy):
        self.strategy = strategy

    def __enter__(self):
        self.strategy.__enter__()
        return self

    def __exit__(self, *exc):
        return self.strategy.__exit__(*exc)

    def __call__(self, wheel, files, mapping):
        self.strategy(wheel, files, mapping)
        wheel.writestr(STARTUP.name, STARTUP.read_text())


setup(cmdclass={"build_py": BuildPyWithStartupHook, "editable_wheel": EditableWheelWithStartupHook})
