# SPDX-License-Identifier: Apache-2.0
"""The package version, in a module of its own so that any layer can read it without importing the top."""

__version__ = "0.1.0"
