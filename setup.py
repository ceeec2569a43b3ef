"""Build the optional C kernels (everything else is in pyproject.toml): the coordinate-wise rules' sorting network
(``_cwkernel.c``), the float64 squared row norms of the norm rules, estimated in one pass and exact
(``_normkernel.c``), and the column sums of ``mean``, the rows added in row order (``_sumkernel.c``).

The extensions are optional: if they cannot be compiled (no C compiler), the package still installs; the
coordinate-wise rules fall back to torch.sort (slower, same results), the norm estimates to torch's blocked
norms (slower, a wider bound, the same decisions) and the column sums to torch's additions one row at a time
(slower, the same bits). On Linux it is built with OpenMP (-fopenmp,
GCC's libgomp — the runtime torch's CPU wheels ship, which the extension then shares with torch: one team of
threads, not two competing); if that fails it is built again without OpenMP (one thread per call).
"""

import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

# no contraction of a*b + c into an FMA: -std=c99 turns it off for GCC, -ffp-contract=off for clang too (the kernels'
# bits are defined by their separate roundings)
extra = ["-O3", "-std=c99", "-ffp-contract=off"] if sys.platform != "win32" else ["/O2"]
OPENMP = ["-fopenmp"] if sys.platform.startswith("linux") else []


class BuildExtOpenMPFirst(build_ext):
    """Build each extension with OpenMP; if the compiler or linker refuses, build it again without."""

    def build_extension(self, ext: Extension) -> None:
        if not OPENMP:
            super().build_extension(ext)
            return
        base_compile, base_link = list(ext.extra_compile_args), list(ext.extra_link_args)
        ext.extra_compile_args = base_compile + OPENMP
        ext.extra_link_args = base_link + OPENMP
        try:
            super().build_extension(ext)
        except Exception as exc:  # CompileError / LinkError (their module differs between setuptools versions)
            print(f"building {ext.name} with OpenMP failed ({exc}); building it without", file=sys.stderr)
            ext.extra_compile_args, ext.extra_link_args = base_compile, base_link
            super().build_extension(ext)


setup(
    cmdclass={"build_ext": BuildExtOpenMPFirst},
    ext_modules=[
        Extension(
            "phalanx.aggregators._cwkernel",
            ["src/phalanx/aggregators/_cwkernel.c"],
            depends=["src/phalanx/aggregators/_cwkernel_streams.h"],
            extra_compile_args=extra,
            optional=True,
        ),
        Extension(
            "phalanx.aggregators._cwselect",
            ["src/phalanx/aggregators/_cwselect.c"],
            extra_compile_args=extra,
            depends=["src/phalanx/aggregators/_cwselect_meamed.h"],
            optional=True,
        ),
        Extension(
            "phalanx.aggregators._normkernel",
            ["src/phalanx/aggregators/_normkernel.c"],
            depends=["src/phalanx/aggregators/_normkernel_narrow.h"],
            extra_compile_args=extra,
            optional=True,
        ),
        Extension(
            "phalanx.aggregators._sumkernel",
            ["src/phalanx/aggregators/_sumkernel.c"],
            extra_compile_args=extra,
            optional=True,
        ),
    ],
)
