"""divviz: the router. Run with `streamlit run app.py` (or `./run app`).

The page scripts live in app_pages/, not pages/: with a pages/ folder present, Streamlit 1.67's sidebar menu
falls back to listing that folder's file names whenever a live fragment reruns (the Training lab's charts).
"""

import streamlit as st

from divviz.app import ui

st.set_page_config(page_title="divviz", page_icon="📈", layout="wide")  # an emoji: drawn by the browser
# itself, where a :material/…: favicon is fetched from fonts.gstatic.com (an error in the console offline)

pages = [
    st.Page("app_pages/home.py", title="Home", icon=":material/home:", default=True),
    st.Page("app_pages/tour.py", title="Tour", icon=":material/school:"),
    st.Page("app_pages/clipping_regions.py", title="Clipping regions", icon=":material/straighten:"),
    st.Page("app_pages/kl3_equivalence.py", title="KL3 ⇔ asymmetric clipping", icon=":material/function:"),
    st.Page("app_pages/mass_reallocation.py", title="Mass reallocation", icon=":material/bar_chart:"),
    st.Page("app_pages/claims.py", title="Claims", icon=":material/fact_check:"),
    st.Page("app_pages/training_lab.py", title="Training lab", icon=":material/model_training:"),
    st.Page("app_pages/runs.py", title="Runs", icon=":material/folder_open:"),
    st.Page("app_pages/step_inspector.py", title="Step inspector", icon=":material/text_select_start:"),
    st.Page("app_pages/catalogue.py", title="Catalogue", icon=":material/menu_book:"),
]
ui.viewer()  # on whichever page a link opens: a teacher key in it is taken and removed from the address bar
st.navigation(pages).run()
