"""The build backend of the listenhub wheel: setuptools, run on a copy.

setuptools builds inside the tree it is given and leaves ``build/`` and
``listenhub.egg-info/`` behind, so ``pip install ./clients/python`` from a
checkout would dirty the checkout. This backend (PEP 517, in-tree through
``backend-path``) copies the package's sources to a temporary directory and
hands every hook to setuptools there; the results go where pip asked, and
the source tree is left as it was. Editable installs are setuptools' own
(they must point at the tree).
"""

import os
import shutil
import tempfile

from setuptools import build_meta as _setuptools

_SKIP = shutil.ignore_patterns("build", "dist", "*.egg-info", "__pycache__", ".mypy_cache", "tests")


def _in_copy(hook, *args, **kwargs):
    src = os.getcwd()
    with tempfile.TemporaryDirectory(prefix="listenhub-build-") as tmp:
        tree = os.path.join(tmp, "src")
        shutil.copytree(src, tree, ignore=_SKIP)
        os.chdir(tree)
        try:
            return hook(*args, **kwargs)
        finally:
            os.chdir(src)


def get_requires_for_build_wheel(config_settings=None):
    return _in_copy(_setuptools.get_requires_for_build_wheel, config_settings)


def get_requires_for_build_sdist(config_settings=None):
    return _in_copy(_setuptools.get_requires_for_build_sdist, config_settings)


def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
    return _in_copy(_setuptools.prepare_metadata_for_build_wheel, os.path.abspath(metadata_directory), config_settings)


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    md = os.path.abspath(metadata_directory) if metadata_directory else None
    return _in_copy(_setuptools.build_wheel, os.path.abspath(wheel_directory), config_settings, md)


def build_sdist(sdist_directory, config_settings=None):
    return _in_copy(_setuptools.build_sdist, os.path.abspath(sdist_directory), config_settings)


get_requires_for_build_editable = getattr(_setuptools, "get_requires_for_build_editable", None)
prepare_metadata_for_build_editable = getattr(_setuptools, "prepare_metadata_for_build_editable", None)
build_editable = getattr(_setuptools, "build_editable", None)
