"""divviz's server. Run with `streamlit run app.py` (or `./run app`): Streamlit finds the `st.App` below and serves
router.py's pages under uvicorn. At start, before any browser asks, a thread imports what the pages read and computes
the Claims page's opening cells (`divviz.app.warm`), so the first page a browser opens pays for neither.
"""

import streamlit as st

from divviz.app import warm

app = st.App("router.py", lifespan=warm.lifespan)
