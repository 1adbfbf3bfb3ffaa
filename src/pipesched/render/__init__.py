"""Pictures of timelines: terminal views, Gantt charts (PNG/SVG), Perfetto traces and a
self-contained HTML report. Every view uses the same colours (``style.py``) and the same
figures (``summary.py``), so one schedule looks the same wherever it is shown.

``views.write_views`` writes any set of them at once; the submodules hold one view each.
"""
