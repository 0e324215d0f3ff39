"""Write README's "Workshop walkthrough" from `divviz.views.tour` (the Tour page's source), its numbers computed
now: `python scripts/walkthrough.py` replaces the block between README's two walkthrough markers.
tests/pages/test_walkthrough.py fails when README holds anything else there."""

from pathlib import Path

from divviz.views import tour

START, END = "<!-- walkthrough: made by scripts/walkthrough.py -->\n", "<!-- walkthrough end -->\n"


def main():
    readme = Path(__file__).resolve().parents[1] / "README.md"
    text = readme.read_text()
    before, rest = text.split(START)
    _, after = rest.split(END)
    readme.write_text(before + START + tour.markdown() + END + after)


if __name__ == "__main__":
    main()
