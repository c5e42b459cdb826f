"""Build hook for the optional C extensions; the project metadata lives in pyproject.toml.

``ferrymq.store._speedups`` speeds up reput and batch puts (see ``ferrymq.store.speedups``);
``ferrymq.common._records`` walks PULL bodies for the Spark source (see ``ferrymq.common.records``);
``ferrymq.remoting._codec`` decodes request frames, the SEND header and the SEND_OK answer (see
``ferrymq.remoting.codec``). All are optional: without a compiler the build warns and the install goes on with the pure-Python code.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "ferrymq.store._speedups",
            # one module from one file per concern (the list and their layouts: _speedups.h)
            sources=[f"src/ferrymq/store/_speedups{part}.c"
                     for part in ("", "_crc", "_scan", "_batch", "_verify", "_pull")],
            depends=["src/ferrymq/store/_speedups.h"],
            extra_compile_args=["-O2"],
            libraries=["z"],  # crc32 of batch bodies (put_batch), the same zlib as Python's zlib module
            optional=True,
        ),
        Extension(
            "ferrymq.common._records",
            sources=["src/ferrymq/common/_records.c"],
            extra_compile_args=["-O2"],
            optional=True,
        ),
        Extension(
            "ferrymq.remoting._codec",
            sources=["src/ferrymq/remoting/_codec.c"],
            extra_compile_args=["-O2"],
            optional=True,
        ),
    ],
)
