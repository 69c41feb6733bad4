"""The report page: one HTML file with inline CSS and the PNGs beside it by relative name.

Why so plain: the file is opened from disk, mailed, or rendered by a
headless browser in CI with no network; it fetches nothing (no CDN, no web
font, no script), so it looks the same everywhere and a test can check
that every image it names loaded.
"""

from __future__ import annotations

import html
from dataclasses import dataclass
from typing import Sequence

import pandas as pd

__all__ = ["Section", "render"]

_CSS = """
body { font-family: sans-serif; margin: 2em auto; max-width: 1250px; color: #222; }
h1 { font-size: 1.5em; } h2 { font-size: 1.15em; border-bottom: 1px solid #ccc; }
.verdict { font-size: 1.1em; background: #eef4ff; border-left: 4px solid #36c; padding: .6em 1em; }
.banner { background: #fff1e0; border-left: 4px solid #e80; padding: .6em 1em; font-weight: bold; }
.note { color: #555; font-style: italic; }
table { border-collapse: collapse; font-size: .85em; margin: .5em 0; }
th, td { border: 1px solid #ccc; padding: .25em .6em; text-align: right; }
th { background: #f4f4f4; } td.text, th.text { text-align: left; }
img { max-width: 100%; border: 1px solid #eee; }
code { background: #f4f4f4; padding: 0 .2em; }
"""


@dataclass(frozen=True)
class Section:
    """A titled part of the page: paragraphs (text, escaped here), images, tables."""

    title: str
    paragraphs: Sequence[str] = ()
    images: Sequence[tuple[str, str]] = ()  # (file name beside report.html, alt text)
    tables: Sequence[pd.DataFrame] = ()
    css_class: str = ""


def _table(frame: pd.DataFrame) -> str:
    return frame.to_html(border=0, na_rep="-", escape=True, float_format=lambda v: f"{v:.6g}")


def _section(s: Section) -> str:
    cls = f' class="{s.css_class}"' if s.css_class else ""
    parts = [f"<h2>{html.escape(s.title)}</h2>"]
    parts += [f"<p{cls}>{html.escape(p)}</p>" for p in s.paragraphs]
    parts += [f'<p><img src="{html.escape(name, quote=True)}" alt="{html.escape(alt, quote=True)}">'
              f"</p>" for name, alt in s.images]
    parts += [_table(t) for t in s.tables]
    return "<section>\n" + "\n".join(parts) + "\n</section>"


def render(title: str, subtitle: str, banners: Sequence[str], sections: Sequence[Section]) -> str:
    """The whole page as text (UTF-8, no external reference)."""
    head = (f'<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
            f"<title>{html.escape(title)}</title>\n<style>{_CSS}</style>\n</head>\n<body>\n"
            f"<h1>{html.escape(title)}</h1>\n<p class=\"note\">{html.escape(subtitle)}</p>\n")
    body = "".join(f'<p class="banner">{html.escape(b)}</p>\n' for b in banners)
    body += "\n".join(_section(s) for s in sections)
    return head + body + "\n</body>\n</html>\n"
