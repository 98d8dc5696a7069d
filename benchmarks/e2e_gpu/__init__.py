# SPDX-License-Identifier: Apache-2.0
"""bench_e2e_gpu's parts: the random models and the fixed-length planner (models), the per-stage clocks and the
timed runs (timing), tables, projection, cost table and JSON (report)."""
