"""``rollcall report DIR``: one self-contained HTML page for a run, a compare or a sweep.

Why: a compare or a sweep ends in CSVs and one sentence; people decide on
pictures. The report draws, from what the commands wrote and nothing else,
the per-worker timeline, goodput and ETTR with their intervals, the
break-even map, the checkpoint-interval U-curve with Young/Daly, and the
verdict in the sentence ``rollcall compare`` prints. App layer: it reads
files and draws; it decides nothing the core decides.
"""

from __future__ import annotations

from rollcall.app.report.build import REPORT_FILE, build
from rollcall.app.report.source import ReportError

__all__ = ["REPORT_FILE", "ReportError", "build"]
