# SPDX-License-Identifier: Apache-2.0
"""In-tree PEP 517 backend: scikit-build-core, after a check that torch is importable in the build env.

dspark's extension must be compiled against the torch it runs with, so it is built without build isolation.
An isolated build (a plain `pip install .`) has no torch; this stops it at once, before CMake is fetched,
with the command to use instead.
"""

from __future__ import annotations

from scikit_build_core import build as _skbuild
from scikit_build_core.build import *  # noqa: F403  (re-export every hook)

_MESSAGE = """
dspark must be built against the torch it will run with, but `import torch` fails in this build environment
(pip builds in an isolated environment by default). Install torch first, then build without isolation:

    pip install torch
    pip install --no-build-isolation .      # add -e for an editable install

or run the README's set-up commands (bash scripts/demo.sh, bash scripts/test.sh), which do both.
"""


def _require_torch() -> None:
    try:
        import torch  # noqa: F401
    except ImportError:
        raise SystemExit(_MESSAGE) from None


def get_requires_for_build_wheel(config_settings=None):
    _require_torch()
    return _skbuild.get_requires_for_build_wheel(config_settings)


def get_requires_for_build_editable(config_settings=None):
    _require_torch()
    return _skbuild.get_requires_for_build_editable(config_settings)
