"""`python -m divviz …` is the `divviz` command; `accelerate launch -m divviz train --backend trl …` runs it
in several processes."""

import sys

from divviz.cli import main

sys.exit(main())
