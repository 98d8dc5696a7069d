# SPDX-License-Identifier: Apache-2.0
"""bench_e2e's parts: the timed methods (runners), prompts and drafters (inputs), tables and JSON (report), plots."""
