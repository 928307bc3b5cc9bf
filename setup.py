"""Only here to ship ``lm_eval_probes.pth`` into site-packages (lm_eval 0.4.13 has no plugin discovery).

All metadata lives in ``setup.cfg``. The ``.pth`` line imports the tiny top-level module
``_lm_eval_probes_autoload``, which registers a lazy ``hf-probes`` model placeholder so that the plain
``lm_eval --model hf-probes`` works. Editable installs do not carry it; regular (wheel) installs do.
"""

import os

from setuptools import setup
from setuptools.command.build_py import build_py

PTH_NAME = "lm_eval_probes.pth"


class BuildPyWithPth(build_py):
    def run(self) -> None:
        super().run()
        self.copy_file(PTH_NAME, os.path.join(self.build_lib, PTH_NAME))

    def get_outputs(self, include_bytecode: bool = True) -> list[str]:
        return super().get_outputs(include_bytecode) + [os.path.join(self.build_lib, PTH_NAME)]


setup(cmdclass={"build_py": BuildPyWithPth})
