"""The compiled part of tracelens: the Kineto chunk decoder (tracelens/ingest/kineto/_native.c).

Everything else is in pyproject.toml. The extension is optional: where it cannot be compiled (no C
compiler), the install goes on and tracelens reads traces with its Python decoders (the same columns,
slower; tracelens.ingest.kineto.native.AVAILABLE says which is in use).
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "tracelens.ingest.kineto._native",
            ["tracelens/ingest/kineto/_native.c"],
            optional=True,
            extra_compile_args=["-O3"],
        )
    ]
)
