"""divviz: the router. Run with `streamlit run app.py` (or `./run app`)."""

import streamlit as st

st.set_page_config(page_title="divviz", page_icon=":material/insights:", layout="wide")

pages = [
    st.Page("pages/home.py", title="Home", icon=":material/home:", default=True),
    st.Page("pages/clipping_regions.py", title="Clipping regions", icon=":material/straighten:"),
    st.Page("pages/kl3_equivalence.py", title="KL3 ⇔ asymmetric clipping", icon=":material/function:"),
    st.Page("pages/mass_reallocation.py", title="Mass reallocation", icon=":material/bar_chart:"),
    st.Page("pages/training_lab.py", title="Training lab", icon=":material/model_training:"),
    st.Page("pages/runs.py", title="Runs", icon=":material/folder_open:"),
    st.Page("pages/catalogue.py", title="Catalogue", icon=":material/menu_book:"),
]
st.navigation(pages).run()
