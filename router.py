"""divviz: the router, the script every browser session runs (app.py serves it: `streamlit run app.py`).

The page scripts live in app_pages/, not pages/: with a pages/ folder present, Streamlit 1.67's sidebar menu
falls back to listing that folder's file names whenever a live fragment reruns (the Training lab's charts).
"""

import streamlit as st

from divviz.app import room
from divviz.app.navigation import PAGES

st.set_page_config(page_title="divviz", page_icon="📈", layout="wide")  # an emoji: drawn by the browser
# itself, where a :material/…: favicon is fetched from fonts.gstatic.com (an error in the console offline)

pages = [st.Page(path, title=title, icon=icon, default=path.endswith("home.py")) for path, title, icon, _ in PAGES]
room.viewer()  # on whichever page a link opens: a teacher key in it is taken and removed from the address bar
st.navigation(pages).run()
