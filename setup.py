"""The compiled parts of tracelens: the Kineto chunk decoder (tracelens/ingest/kineto/_native.c) and the
level loop of the critical path's replay (tracelens/analyze/critical/_replay.c).

Everything else is in pyproject.toml. The extensions are optional: where they cannot be compiled (no C
compiler), the install goes on and tracelens reads traces with its Python decoders and replays graphs with
its Python loop (the same results, slower; tracelens.ingest.kineto.native.AVAILABLE and
tracelens.analyze.critical.critical_replay.NATIVE say which is in use).
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "tracelens.ingest.kineto._native",
            ["tracelens/ingest/kineto/_native.c"],
            optional=True,
            extra_compile_args=["-O3"],
        ),
        Extension(
            "tracelens.analyze.critical._replay",
            ["tracelens/analyze/critical/_replay.c"],
            optional=True,
            extra_compile_args=["-O3"],
        ),
    ]
)
