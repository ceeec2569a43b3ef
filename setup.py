"""Build the optional C kernel of the coordinate-wise rules (everything else is in pyproject.toml).

The extension is optional: if it cannot be compiled (no C compiler), the package still installs and the
coordinate-wise rules fall back to torch.sort (slower, same results).
"""

import sys

from setuptools import Extension, setup

extra = ["-O3", "-std=c99"] if sys.platform != "win32" else ["/O2"]

setup(
    ext_modules=[
        Extension(
            "phalanx.aggregators._cwkernel",
            ["src/phalanx/aggregators/_cwkernel.c"],
            extra_compile_args=extra,
            optional=True,
        )
    ]
)
